#pragma once
// The softmax row kernels: softmax_row, the steps of one row that softmax
// (softmax.cu) and softmax_with_cross_entropy (cross_entropy_kernels.cuh)
// share, and softmax's forward and gradient kernels. The element steps are
// runtime/kernels/softmax_row.h's, as softmax.cu's header describes. Like
// row_group.cuh it needs no CUDA header, so
// tests/unit/test_softmax_kernels_emulated.cc runs this same source on the CPU.
#include <cmath>
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/kernels/softmax_row.h"
#include "runtime/ops/cuda/row_group.cuh"

namespace mix::cuda {

/// Softmax of one row by a RowGroup<kThreads>: y = softmax(x) through the
/// shared row steps (max, exp_shifted, softmax_normalizer). Returns the row's
/// max and sum of exponentials, which cross-entropy also needs. Every thread
/// of the group calls it. The sum adds ceil(cols / kThreads) terms per thread
/// in order, then the group's fixed tree (5 levels in a warp, 8 in a block).
/// X and Y are the storage types of x and y: the same, or FP16/BF16 x with
/// FP32 y (runtime/ops/widening.h).
struct RowSoftmax {
  float max, sum;
};
template <int kThreads, typename X, typename Y>
__device__ RowSoftmax softmax_row(const X* xr, Y* yr, int64_t cols, float* shared) {
  using G = RowGroup<kThreads>;
  float m = -INFINITY;
  for (int64_t i = G::tid(); i < cols; i += kThreads) m = fn::max_of(m, to_float(xr[i]));
  m = G::reduce(m, shared, MaxOf{});
  float s = 0.f;
  for (int64_t i = G::tid(); i < cols; i += kThreads) s = __fadd_rn(s, fn::exp_shifted(to_float(xr[i]), m));
  s = G::reduce(s, shared, AddRn{});
  if (yr != nullptr) {  // null: only the max and sum are wanted (cross-entropy without a stored softmax)
    const fn::SoftmaxNormalize f = fn::softmax_normalizer(m, s);
    for (int64_t i = G::tid(); i < cols; i += kThreads) yr[i] = from_float<Y>(f(to_float(xr[i])));
  }
  return {m, s};
}

// ---- softmax and softmax_grad (rows of length cols; grid-stride over rows) --------------
// t is the causal query count (dim -2 of X), or 0 for a plain softmax: row r
// then keeps valid = causal_valid_cols(r, t, cols) columns.

__device__ __forceinline__ int64_t softmax_valid_cols(int64_t r, int64_t t, int64_t cols) {
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
    const int64_t valid = softmax_valid_cols(r, t, cols);
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
    const int64_t valid = softmax_valid_cols(r, t, cols);
    float dot = 0.f;
    for (int64_t i = G::tid(); i < valid; i += kThreads)
      dot = __fadd_rn(dot, fn::softmax_grad_dot_term(to_float(yr[i]), to_float(dyr[i])));
    dot = G::reduce(dot, shared, AddRn{});
    const fn::SoftmaxGradElem f{dot};
    for (int64_t i = G::tid(); i < valid; i += kThreads) dxr[i] = from_float<DX>(f(to_float(yr[i]), to_float(dyr[i])));
    for (int64_t i = valid + G::tid(); i < cols; i += kThreads) dxr[i] = from_float<DX>(0.f);
  }
}

}  // namespace mix::cuda
