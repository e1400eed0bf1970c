#pragma once
// Row-wise softmax math, written once for host and device (MIX_HD). A row is n
// contiguous values of storage type T (float, half_t, bf16_t); every function
// widens on load, computes in FP32 and rounds to T only on store.
//
// The CPU kernels (runtime/ops/softmax.cc, softmax_with_cross_entropy.cc) run
// the whole-row functions, one row at a time. A CUDA kernel that gives a row to
// one thread can call them unchanged; one that splits a row over a block does
// its max and sum as block reductions and applies the element functors
// (SoftmaxNormalize, SoftmaxGradElem) so its arithmetic stays identical.
#include <cmath>
#include <cstdint>

#include "runtime/half.h"

namespace mix::fn {

/// exp(x - max) * inv_sum: one softmax output from its logit.
struct SoftmaxNormalize {
  float max, inv_sum;
  MIX_HD float operator()(float x) const { return expf(x - max) * inv_sum; }
};

/// y * (dy - dot), dot = sum(dy * y) over the row: one softmax input gradient.
struct SoftmaxGradElem {
  float dot;
  MIX_HD float operator()(float y, float dy) const { return y * (dy - dot); }
};

template <typename T>
MIX_HD float row_max(const T* x, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    const float v = to_float(x[i]);
    m = v > m ? v : m;
  }
  return m;
}

/// sum(exp(x - max)); subtracting the max keeps every term in (0, 1], so the
/// sum cannot overflow and is at least 1.
template <typename T>
MIX_HD float row_sum_exp(const T* x, int64_t n, float max) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += expf(to_float(x[i]) - max);
  return s;
}

/// y = softmax(x) over one row. A row of all -inf gives NaN, as in PyTorch.
template <typename T>
MIX_HD void softmax_row(const T* x, T* y, int64_t n) {
  const float m = row_max(x, n);
  const SoftmaxNormalize f{m, 1.f / row_sum_exp(x, n, m)};
  for (int64_t i = 0; i < n; ++i) y[i] = from_float<T>(f(to_float(x[i])));
}

/// dx = y * (dy - sum(dy * y)) over one row, y the forward output.
template <typename T>
MIX_HD void softmax_grad_row(const T* y, const T* dy, T* dx, int64_t n) {
  float dot = 0.f;
  for (int64_t i = 0; i < n; ++i) dot += to_float(dy[i]) * to_float(y[i]);
  const SoftmaxGradElem f{dot};
  for (int64_t i = 0; i < n; ++i) dx[i] = from_float<T>(f(to_float(y[i]), to_float(dy[i])));
}

/// Softmax of one row into y, and the cross-entropy -log softmax(x)[label]
/// returned in FP32. The loss is log(sum exp(x - max)) + max - x[label], formed
/// from the logits rather than from log(y), so it stays accurate where y[label]
/// underflows (a confidently wrong prediction gives a large finite loss, not inf).
template <typename T>
MIX_HD float softmax_cross_entropy_row(const T* x, T* y, int64_t n, int64_t label) {
  const float m = row_max(x, n);
  const float s = row_sum_exp(x, n, m);
  const SoftmaxNormalize f{m, 1.f / s};
  for (int64_t i = 0; i < n; ++i) y[i] = from_float<T>(f(to_float(x[i])));
  return logf(s) + m - to_float(x[label]);
}

/// dlogits = (softmax - onehot(label)) * dloss over one row.
template <typename T>
MIX_HD void softmax_cross_entropy_grad_row(const T* y, T* dx, int64_t n, int64_t label, float dloss) {
  for (int64_t i = 0; i < n; ++i) {
    const float onehot = i == label ? 1.f : 0.f;
    dx[i] = from_float<T>((to_float(y[i]) - onehot) * dloss);
  }
}

}  // namespace mix::fn
