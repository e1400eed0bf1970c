#pragma once
// Row-wise softmax math, written once for host and device (MIX_HD). A row is n
// contiguous values of storage type T (float, half_t, bf16_t); every function
// widens on load, computes in FP32 and rounds to T only on store.
//
// The CPU kernels (runtime/ops/softmax.cc, softmax_with_cross_entropy.cc) run
// the whole-row functions, one row at a time. A CUDA kernel that gives a row to
// one thread can call them unchanged; one that splits a row over a block
// (runtime/ops/cuda/softmax.cu, cross_entropy.cu) does its max and sums as
// block reductions that combine with max_of and FP32 adds, and applies the
// element steps below (exp_shifted, SoftmaxNormalize, ...), so only the order
// of the row's additions differs from the CPU's.
//
// softmax's causal mode runs the *_prefix functions: a row's first `valid`
// values (causal_valid_cols) are normalised and the rest written as exact zeros.
#include <cmath>
#include <cstdint>

#include "runtime/core/half.h"

namespace mix::fn {

// ---- element and combine steps (shared by the whole-row functions below and
// the CUDA kernels, whose block reductions combine partial results with them) --

/// The running maximum of a row: v replaces m only when strictly larger, so a
/// NaN never becomes the maximum (the row's sum of exponentials turns NaN instead).
MIX_HD float max_of(float m, float v) { return v > m ? v : m; }

/// exp(x - max): one term of a row's sum, and the numerator of its softmax.
MIX_HD float exp_shifted(float x, float max) { return expf(x - max); }

/// exp(x - max) * inv_sum: one softmax output from its logit. On the GPU the
/// multiply is rounded on its own (__fmul_rn): nvcc would otherwise contract it
/// with whatever follows into an FMA, and a softmax recomputed in
/// softmax_with_cross_entropy_grad (y - onehot) would then differ from the one
/// the forward stored (runtime/passes/recompute_softmax.h). A lone multiply rounds the
/// same either way, so stored values do not change.
struct SoftmaxNormalize {
  float max, inv_sum;
  MIX_HD float operator()(float x) const {
#ifdef __CUDA_ARCH__
    return __fmul_rn(exp_shifted(x, max), inv_sum);
#else
    return exp_shifted(x, max) * inv_sum;
#endif
  }
};
/// The normaliser of a row from its max and sum(exp(x - max)).
MIX_HD SoftmaxNormalize softmax_normalizer(float max, float sum_exp) { return SoftmaxNormalize{max, 1.f / sum_exp}; }

/// dy * y: one term of softmax_grad's dot = sum(dy * y) over the row.
MIX_HD float softmax_grad_dot_term(float y, float dy) { return dy * y; }

/// y * (dy - dot), dot = sum(dy * y) over the row: one softmax input gradient.
struct SoftmaxGradElem {
  float dot;
  MIX_HD float operator()(float y, float dy) const { return y * (dy - dot); }
};

/// The cross-entropy -log softmax(x)[label] = log(sum exp(x - max)) + max - x[label].
MIX_HD float cross_entropy_loss(float sum_exp, float max, float x_label) { return logf(sum_exp) + max - x_label; }

/// One element of dlogits = (softmax - onehot(label)) * dloss.
MIX_HD float softmax_cross_entropy_grad_elem(float y, bool is_label, float dloss) {
  const float onehot = is_label ? 1.f : 0.f;
  return (y - onehot) * dloss;
}

// ---- whole rows ------------------------------------------------------------------

template <typename T>
MIX_HD float row_max(const T* x, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = max_of(m, to_float(x[i]));
  return m;
}

/// sum(exp(x - max)); subtracting the max keeps every term in (0, 1], so the
/// sum cannot overflow and is at least 1.
template <typename T>
MIX_HD float row_sum_exp(const T* x, int64_t n, float max) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += exp_shifted(to_float(x[i]), max);
  return s;
}

/// y = softmax(x) over one row. A row of all -inf gives NaN, as in PyTorch.
template <typename T>
MIX_HD void softmax_row(const T* x, T* y, int64_t n) {
  const float m = row_max(x, n);
  const SoftmaxNormalize f = softmax_normalizer(m, row_sum_exp(x, n, m));
  for (int64_t i = 0; i < n; ++i) y[i] = from_float<T>(f(to_float(x[i])));
}

/// dx = y * (dy - sum(dy * y)) over one row, y the forward output.
template <typename T>
MIX_HD void softmax_grad_row(const T* y, const T* dy, T* dx, int64_t n) {
  float dot = 0.f;
  for (int64_t i = 0; i < n; ++i) dot += softmax_grad_dot_term(to_float(y[i]), to_float(dy[i]));
  const SoftmaxGradElem f{dot};
  for (int64_t i = 0; i < n; ++i) dx[i] = from_float<T>(f(to_float(y[i]), to_float(dy[i])));
}

// ---- causal rows (softmax with causal=true) -----------------------------------------

/// The number of columns row `row` of a causal softmax over X [..., t, s] keeps:
/// query i = row mod t sees keys j <= i + (s - t) (the last query sees all s
/// keys; with s > t the first s - t keys are a prefix every query sees, as with
/// a cache of earlier positions). The caller guarantees t <= s, so this is in [1, s].
MIX_HD int64_t causal_valid_cols(int64_t row, int64_t t, int64_t s) { return row % t + (s - t) + 1; }

/// y = softmax over the first `valid` of the row's n values; y[valid..n) = 0
/// exactly, as if those logits were -inf (masked keys get no probability and,
/// through softmax_grad_row_prefix, no gradient).
template <typename T>
MIX_HD void softmax_row_prefix(const T* x, T* y, int64_t n, int64_t valid) {
  softmax_row(x, y, valid);
  for (int64_t i = valid; i < n; ++i) y[i] = from_float<T>(0.f);
}

/// softmax_grad_row over the first `valid` values; dx beyond is 0. The full-row
/// formula would give 0 there too (y is 0), but only while dy is finite there:
/// 0 * inf is NaN, so the masked tail is never read.
template <typename T>
MIX_HD void softmax_grad_row_prefix(const T* y, const T* dy, T* dx, int64_t n, int64_t valid) {
  softmax_grad_row(y, dy, dx, valid);
  for (int64_t i = valid; i < n; ++i) dx[i] = from_float<T>(0.f);
}

// ---- cross-entropy rows (softmax_with_cross_entropy) ---------------------------------
//
// The loss is log(sum exp(x - max)) + max - x[label] (cross_entropy_loss),
// formed from the logits rather than from log(softmax), so it stays accurate
// where softmax[label] underflows (a confidently wrong prediction gives a
// large finite loss, not inf).

/// A row's max and sum(exp(x - max)): its softmax, its loss, and (saved as
/// RowStats) the softmax the gradient recomputes.
struct RowStats {
  float max, sum;
};
template <typename T>
MIX_HD RowStats row_stats(const T* x, int64_t n) {
  const float m = row_max(x, n);
  return {m, row_sum_exp(x, n, m)};
}

/// One softmax value as the forward op stores it in Y, read back as float:
/// the same bits whether the gradient reads the stored Softmax or recomputes
/// it from the logit and the row's stats (the same normaliser, the same rounding).
template <typename Y>
MIX_HD float softmax_as_stored(const SoftmaxNormalize& f, float x) {
  return to_float(from_float<Y>(f(x)));
}

/// dlogits = (softmax - onehot(label)) * dloss over one row of FP32 values.
MIX_HD void softmax_cross_entropy_grad_row(const float* y, float* dx, int64_t n, int64_t label, float dloss) {
  for (int64_t i = 0; i < n; ++i) dx[i] = softmax_cross_entropy_grad_elem(y[i], i == label, dloss);
}

}  // namespace mix::fn
