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
//
// The kernels are in softmax_kernels.cuh, which the emulated test runs on the
// CPU; this file holds the launchers.
#include <string>

#include "runtime/kernels/softmax_row.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/cuda/softmax_kernels.cuh"
#include "runtime/ops/softmax_shapes.h"
#include "runtime/ops/widening.h"

namespace mix::cuda {
namespace {

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
