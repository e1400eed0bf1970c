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
#include <string>

#include "runtime/kernels/softmax_row.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/softmax_shapes.h"

namespace mix::cuda {
namespace {

// ---- kernels (rows of length cols; grid-stride over rows) ------------------------------
// t is the causal query count (dim -2 of X), or 0 for a plain softmax: row r
// then keeps valid = causal_valid_cols(r, t, cols) columns.

__device__ __forceinline__ int64_t row_valid(int64_t r, int64_t t, int64_t cols) {
  return t > 0 ? fn::causal_valid_cols(r, t, cols) : cols;
}

/// Row r of the output by `group`: the valid prefix normalised, zeros after it.
template <typename T, typename Group>
__device__ void softmax_one_row(const T* x, T* y, int64_t r, int64_t cols, int64_t t, Group group) {
  const T* xr = x + r * cols;
  T* yr = y + r * cols;
  const int64_t valid = row_valid(r, t, cols);
  softmax_row(xr, yr, valid, group);
  for (int64_t i = valid + group.lane(); i < cols; i += Group::kSize) yr[i] = from_float<T>(0.f);
}

/// Row r of dX by `group`: dot = sum(y * dy) over the valid prefix, then
/// SoftmaxGradElem there and zeros after it.
template <typename T, typename Group>
__device__ void softmax_grad_one_row(const T* y, const T* dy, T* dx, int64_t r, int64_t cols, int64_t t, Group group) {
  const T* yr = y + r * cols;
  const T* dyr = dy + r * cols;
  T* dxr = dx + r * cols;
  const int64_t valid = row_valid(r, t, cols);
  float dot = 0.f;
  for (int64_t i = group.lane(); i < valid; i += Group::kSize)
    dot = __fadd_rn(dot, fn::softmax_grad_dot_term(to_float(yr[i]), to_float(dyr[i])));
  dot = group.reduce(dot, AddRn{});
  const fn::SoftmaxGradElem f{dot};
  for (int64_t i = group.lane(); i < valid; i += Group::kSize)
    dxr[i] = from_float<T>(f(to_float(yr[i]), to_float(dyr[i])));
  for (int64_t i = valid + group.lane(); i < cols; i += Group::kSize) dxr[i] = from_float<T>(0.f);
}

// A block's rows (grid stride), or a warp's: every thread of a warp has the
// same r, so the warp's shuffles always have all 32 lanes.
template <typename T>
__global__ void softmax_rows_block(const T* x, T* y, int64_t rows, int64_t cols, int64_t t) {
  __shared__ float shared[kBlock];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) softmax_one_row(x, y, r, cols, t, BlockRow{shared});
}
template <typename T>
__global__ void softmax_rows_warp(const T* x, T* y, int64_t rows, int64_t cols, int64_t t) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kBlock / kWarp);
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(kBlock) + threadIdx.x) / kWarp; r < rows; r += warps)
    softmax_one_row(x, y, r, cols, t, WarpRow{});
}
template <typename T>
__global__ void softmax_grad_rows_block(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, int64_t t) {
  __shared__ float shared[kBlock];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) softmax_grad_one_row(y, dy, dx, r, cols, t, BlockRow{shared});
}
template <typename T>
__global__ void softmax_grad_rows_warp(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, int64_t t) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kBlock / kWarp);
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(kBlock) + threadIdx.x) / kWarp; r < rows; r += warps)
    softmax_grad_one_row(y, dy, dx, r, cols, t, WarpRow{});
}

// ---- launchers -----------------------------------------------------------------------

using softmax_rules::Rows;
// softmax_rules::rows_of makes the CPU kernels' checks: the last axis only, and
// with causal a [..., T, S] input with T <= S.
using softmax_rules::rows_of;

/// Whether rows of `cols` elements go to a warp each (else a block each).
bool warp_rows(int64_t cols) { return cols <= kWarpRowMax; }
/// Blocks for `rows` rows: a row per block, or kBlock / kWarp rows per block.
unsigned row_blocks(int64_t rows, int64_t cols) {
  const int64_t per_block = warp_rows(cols) ? kBlock / kWarp : 1;
  return static_cast<unsigned>(std::clamp<int64_t>((rows + per_block - 1) / per_block, 1, 65535));
}

void softmax_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");  // by value: Out may replace X's scope entry
  check_on_device(ctx, x, "X");
  const Rows r = rows_of(ctx.op, x.shape(), "X");
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  if (r.rows == 0) return;
  const cudaStream_t stream = compute_stream(ctx);
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const auto kernel = warp_rows(r.cols) ? softmax_rows_warp<T> : softmax_rows_block<T>;
    kernel<<<row_blocks(r.rows, r.cols), kBlock, 0, stream>>>(x.data<T>(), out.data<T>(), r.rows, r.cols, r.t);
    MIX_CUDA_CHECK(cudaGetLastError());
  });
}

void softmax_grad_cuda(OpContext& ctx) {
  const Tensor y = ctx.in("Out");
  const Tensor dy = ctx.in("Out@GRAD");
  MIX_CHECK(y.shape() == dy.shape() && y.dtype() == dy.dtype(),
            "softmax_grad: Out@GRAD " << shape_str(dy.shape()) << " does not match Out " << shape_str(y.shape()));
  check_on_device(ctx, y, "Out");
  check_on_device(ctx, dy, "Out@GRAD");
  const Rows r = rows_of(ctx.op, y.shape(), "Out");
  Tensor& dx = ctx.out("X@GRAD", y.shape(), y.dtype());
  if (r.rows == 0) return;
  const cudaStream_t stream = compute_stream(ctx);
  dispatch_floating(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const auto kernel = warp_rows(r.cols) ? softmax_grad_rows_warp<T> : softmax_grad_rows_block<T>;
    kernel<<<row_blocks(r.rows, r.cols), kBlock, 0, stream>>>(y.data<T>(), dy.data<T>(), dx.data<T>(), r.rows, r.cols,
                                                              r.t);
    MIX_CUDA_CHECK(cudaGetLastError());
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("softmax", softmax_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("softmax_grad", softmax_grad_cuda);

}  // namespace
}  // namespace mix::cuda
