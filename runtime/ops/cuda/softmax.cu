// CUDA kernels of softmax (last axis) and softmax_grad: a row per warp for
// rows of up to kWarpRowMax (1024) elements (attention's rows), else a row per
// block; the row's max and sums as group reductions (fixed trees, no atomics),
// and the element steps of runtime/kernels/softmax_row.h (exp_shifted,
// softmax_normalizer, SoftmaxNormalize, softmax_grad_dot_term, SoftmaxGradElem).
// Only the order of the row's additions differs from the CPU's sequential loop.
//
// causal=true (attention's mask, softmax.cc): row r normalises only its first
// fn::causal_valid_cols(r, T, S) values and writes exact zeros after them, as
// fn::softmax_row_prefix does; the grad reads and writes the same prefix and
// zeros the rest (fn::softmax_grad_row_prefix), so a non-finite dY on a
// masked key never reaches dX.
//
// Attr out_dtype "f32" (runtime/ops/widening.h): FP16/BF16 X, FP32 Out, and
// the grad's X@GRAD in X's dtype, as in the CPU kernels; the grad also reads
// an FP16/BF16 Out@GRAD of an FP32 Out.
#include <string>

#include "runtime/kernels/softmax_row.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/softmax_shapes.h"
#include "runtime/ops/widening.h"

namespace mix::cuda {
namespace {

// ---- kernels (rows of length cols; grid-stride over rows) ------------------------------
// t is the causal query count (dim -2 of X), or 0 for a plain softmax: row r
// then keeps valid = causal_valid_cols(r, t, cols) columns.

__device__ __forceinline__ int64_t row_valid(int64_t r, int64_t t, int64_t cols) {
  return t > 0 ? fn::causal_valid_cols(r, t, cols) : cols;
}

// y = softmax of each row (its valid prefix; zeros after it), a row per
// RowGroup<kThreads>.
template <typename X, typename Y, int kThreads>
__global__ void softmax_rows(const X* x, Y* y, int64_t rows, int64_t cols, int64_t t) {
  using G = RowGroup<kThreads>;
  __shared__ float shared[kBlock / kWarp];
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const X* xr = x + r * cols;
    Y* yr = y + r * cols;
    const int64_t valid = row_valid(r, t, cols);
    softmax_row<kThreads>(xr, yr, valid, shared);
    for (int64_t i = valid + G::tid(); i < cols; i += kThreads) yr[i] = from_float<Y>(0.f);
  }
}

// dx of each row: dot = sum(y * dy) over the valid prefix, then
// SoftmaxGradElem there and zeros after it; dy in DY (Y's storage type, or
// FP16/BF16 for an FP32 y), dx in DX (X's storage type).
template <typename Y, typename DY, typename DX, int kThreads>
__global__ void softmax_grad_rows(const Y* y, const DY* dy, DX* dx, int64_t rows, int64_t cols, int64_t t) {
  using G = RowGroup<kThreads>;
  __shared__ float shared[kBlock / kWarp];
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const Y* yr = y + r * cols;
    const DY* dyr = dy + r * cols;
    DX* dxr = dx + r * cols;
    const int64_t valid = row_valid(r, t, cols);
    float dot = 0.f;
    for (int64_t i = G::tid(); i < valid; i += kThreads)
      dot = __fadd_rn(dot, fn::softmax_grad_dot_term(to_float(yr[i]), to_float(dyr[i])));
    dot = G::reduce(dot, shared, AddRn{});
    const fn::SoftmaxGradElem f{dot};
    for (int64_t i = G::tid(); i < valid; i += kThreads) dxr[i] = from_float<DX>(f(to_float(yr[i]), to_float(dyr[i])));
    for (int64_t i = valid + G::tid(); i < cols; i += kThreads) dxr[i] = from_float<DX>(0.f);
  }
}

// ---- launchers -----------------------------------------------------------------------

using softmax_rules::Rows;
// softmax_rules::rows_of makes the CPU kernels' checks: the last axis only, and
// with causal a [..., T, S] input with T <= S.
using softmax_rules::rows_of;

void softmax_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");  // by value: Out may replace X's scope entry
  check_on_device(ctx, x, "X");
  const Rows r = rows_of(ctx.op, x.shape(), "X");
  Tensor& out = ctx.out("Out", x.shape(), widening::out_dtype(ctx.op, x.dtype()));
  if (r.rows == 0) return;
  const cudaStream_t stream = compute_stream(ctx);
  widening::dispatch(x.dtype(), out.dtype(), [&](auto x_tag, auto y_tag) {
    using X = decltype(x_tag);
    using Y = decltype(y_tag);
    with_row_group(r.cols, [&](auto threads) {
      constexpr int kThreads = decltype(threads)::value;
      softmax_rows<X, Y, kThreads>
          <<<row_group_blocks<kThreads>(r.rows), kBlock, 0, stream>>>(x.data<X>(), out.data<Y>(), r.rows, r.cols, r.t);
      MIX_CUDA_CHECK(cudaGetLastError());
    });
  });
}

void softmax_grad_cuda(OpContext& ctx) {
  const Tensor y = ctx.in("Out");
  const Tensor dy = ctx.in("Out@GRAD");
  MIX_CHECK(y.shape() == dy.shape() && widening::allowed(dy.dtype(), y.dtype()),
            "softmax_grad: Out@GRAD " << dtype_name(dy.dtype()) << shape_str(dy.shape()) << " does not match Out "
                                      << dtype_name(y.dtype()) << shape_str(y.shape()));
  check_on_device(ctx, y, "Out");
  check_on_device(ctx, dy, "Out@GRAD");
  const Rows r = rows_of(ctx.op, y.shape(), "Out");
  Tensor& dx = ctx.out("X@GRAD", y.shape(), widening::x_grad_dtype(ctx.op, y.dtype()));
  if (r.rows == 0) return;
  const cudaStream_t stream = compute_stream(ctx);
  widening::dispatch(dx.dtype(), y.dtype(), [&](auto dx_tag, auto y_tag) {
    using DX = decltype(dx_tag);
    using Y = decltype(y_tag);
    widening::dispatch_grad_input<Y>(dy.dtype(), y.dtype(), [&](auto dy_tag) {
      using DY = decltype(dy_tag);
      with_row_group(r.cols, [&](auto threads) {
        constexpr int kThreads = decltype(threads)::value;
        softmax_grad_rows<Y, DY, DX, kThreads><<<row_group_blocks<kThreads>(r.rows), kBlock, 0, stream>>>(
            y.data<Y>(), dy.data<DY>(), dx.data<DX>(), r.rows, r.cols, r.t);
        MIX_CUDA_CHECK(cudaGetLastError());
      });
    });
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("softmax", softmax_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("softmax_grad", softmax_grad_cuda);

}  // namespace
}  // namespace mix::cuda
