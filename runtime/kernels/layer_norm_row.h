#pragma once
// Row-wise layer_norm math, written once for host and device (MIX_HD). A row
// is the n contiguous values normalised together (X [rows, n] after
// flattening at begin_norm_axis) of storage type T (float, half_t, bf16_t);
// Scale and Bias are FP32 [n] (either may be null: 1 and 0), the statistics
// are FP32, and values are rounded to T only on store.
//
// The CPU kernel (runtime/ops/layer_norm.cc) runs the whole-row functions one
// row at a time; they accumulate in double. A CUDA kernel that splits a row
// over a block computes the same sums as block reductions (in FP32: for rows
// of a few thousand values the difference is far inside the FP16 tolerance)
// and applies the element steps below, so only the summation differs.
#include <cmath>
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/kernels/functors.h"

namespace mix::fn {

// ---- element steps ---------------------------------------------------------------------

/// 1 / sqrt(var + eps), from the stored (biased) variance: the forward and the
/// grad both derive it from Variance, so they agree exactly.
MIX_HD float ln_inv_std(float var, float eps) { return 1.f / sqrtf(var + eps); }

/// y = (x - mean) * inv_std * scale + bias, for one element of a row.
struct LayerNormNormalize {
  float mean, inv_std;
  MIX_HD float operator()(float x, float scale, float bias) const { return (x - mean) * inv_std * scale + bias; }
};

/// xhat = (x - mean) * inv_std: the normalised value, also the summand factor
/// of Scale@GRAD = sum over rows of dy * xhat.
MIX_HD float ln_xhat(float x, float mean, float inv_std) { return (x - mean) * inv_std; }

/// dX for one element, from the row's means over its n values of g = dy * scale
/// and of g * xhat: dx = inv_std * (g - mean(g) - xhat * mean(g * xhat)).
/// (d/dx of xhat removes the mean and the component along xhat.)
struct LayerNormBackward {
  float mean, inv_std, mean_g, mean_g_xhat;
  MIX_HD float operator()(float x, float dy, float scale) const {
    const float xhat = ln_xhat(x, mean, inv_std);
    return inv_std * (dy * scale - mean_g - xhat * mean_g_xhat);
  }
};

// ---- whole rows --------------------------------------------------------------------------

struct LayerNormStats {
  float mean, var;  // var is biased (divided by n), as Paddle stores it
};

/// Mean and biased variance of one row, two passes in double: the second pass
/// sums (x - mean)^2, which stays accurate when |mean| >> std (sum(x^2)/n -
/// mean^2 would cancel).
template <typename T>
MIX_HD LayerNormStats layer_norm_row_stats(const T* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(to_float(x[i]));
  const double mean = s / static_cast<double>(n);
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(to_float(x[i])) - mean;
    ss += d * d;
  }
  return {static_cast<float>(mean), static_cast<float>(ss / static_cast<double>(n))};
}

/// y = layer_norm(x) over one row; returns the row's statistics (stored as
/// Mean and Variance). scale / bias may be null. Y may be narrower than X (an
/// FP16 y of an FP32 x: each value rounded once, on store).
template <typename TX, typename TY>
MIX_HD LayerNormStats layer_norm_row(const TX* x, TY* y, int64_t n, const float* scale, const float* bias, float eps) {
  const LayerNormStats st = layer_norm_row_stats(x, n);
  const LayerNormNormalize f{st.mean, ln_inv_std(st.var, eps)};
  for (int64_t i = 0; i < n; ++i)
    y[i] = from_float<TY>(f(to_float(x[i]), scale ? scale[i] : 1.f, bias ? bias[i] : 0.f));
  return st;
}

/// layer_norm over `rows` rows of n values (the CPU kernels' loop, for
/// layer_norm and fused_add_layer_norm): each row's statistics into mean[r]
/// and var[r].
template <typename TX, typename TY>
void layer_norm_rows(const TX* x, TY* y, int64_t rows, int64_t n, const float* scale, const float* bias, float eps,
                     float* mean, float* var) {
  for (int64_t r = 0; r < rows; ++r) {
    const LayerNormStats st = layer_norm_row(x + r * n, y + r * n, n, scale, bias, eps);
    mean[r] = st.mean;
    var[r] = st.var;
  }
}

/// dx over one row from the forward's saved mean and variance (scale may be
/// null). Scale@GRAD and Bias@GRAD are column sums over rows, which the caller
/// accumulates (ln_xhat * dy and dy). dy may be narrower than x and dx (the
/// gradient of a narrower y: widened on load, exact). With `acc` (input
/// Accumulate, else null), dx is that other part of x's gradient plus this
/// one, as fn::add_grad_part adds them.
template <typename T, typename TDY>
MIX_HD void layer_norm_grad_row(const T* x, const TDY* dy, T* dx, int64_t n, const float* scale, float mean, float var,
                                float eps, const T* acc = nullptr) {
  const float inv_std = ln_inv_std(var, eps);
  double sg = 0.0, sgx = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float g = to_float(dy[i]) * (scale ? scale[i] : 1.f);
    sg += static_cast<double>(g);
    sgx += static_cast<double>(g) * static_cast<double>(ln_xhat(to_float(x[i]), mean, inv_std));
  }
  const LayerNormBackward b{mean, inv_std, static_cast<float>(sg / static_cast<double>(n)),
                            static_cast<float>(sgx / static_cast<double>(n))};
  for (int64_t i = 0; i < n; ++i) {
    const float own = b(to_float(x[i]), to_float(dy[i]), scale ? scale[i] : 1.f);
    dx[i] = acc ? add_grad_part<T>(own, to_float(acc[i])) : from_float<T>(own);
  }
}

}  // namespace mix::fn
