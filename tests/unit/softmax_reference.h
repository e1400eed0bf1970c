#pragma once
// Softmax, its gradient and cross-entropy's loss in double, and the error
// bounds of the kernels against them: what the softmax tests on the GPU
// (test_cuda_ops.cc, test_cuda_transformer_ops.cc) and on the emulated GPU
// kernels (test_softmax_kernels_emulated.cc) share. Each row is normalised
// over its first `valid` values (all of them, a causal prefix, or a padded
// vocabulary's real classes); the rest are exactly 0.
//
// The bounds, for a row sum of `terms` chained FP32 adds (the CPU's sequence
// adds n; a GPU row gpu_row_terms or gpu_block_row_terms, cuda_compare.h):
//  - softmax: expf within 2 ulp (4u) in each term and in the output, the
//    sum's adds u each, 1/sum and the multiply u each, + slack:
//    (terms + 20)·u relative, and half an ulp of the stored type;
//  - softmax_grad: the dot's FP32 summation error terms·u·sum|dy·y|, scaled by
//    |y_i|, then dy_i - dot and the multiply u each;
//  - cross-entropy's loss, log(s) + max - x[label]: the sum's relative error
//    becomes an absolute error of log(s) ((terms + 8)·u with the expf terms),
//    logf within 1 ulp and two adds: 4u of the magnitudes involved.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/tensor.h"
#include "tests/unit/cuda_compare.h"

namespace mix::testing {

/// Softmax rows in double from float logits [rows, cols], each over its first
/// valid[r] values (0 after them), with x - max rounded in float as the
/// kernels round it (the kernels' defined input to exp); each row's max and
/// log(sum exp(x - max)).
struct SoftmaxRef {
  int64_t cols = 0;
  std::vector<int64_t> valid;
  std::vector<double> y, max, lse;
  int64_t row_of(int64_t e) const { return e / cols; }
  bool masked(int64_t e) const { return e % cols >= valid[static_cast<size_t>(row_of(e))]; }
  /// The flat positions after each row's valid prefix.
  std::vector<int64_t> masked_entries() const {
    std::vector<int64_t> at;
    for (int64_t e = 0; e < static_cast<int64_t>(y.size()); ++e)
      if (masked(e)) at.push_back(e);
    return at;
  }
};
inline SoftmaxRef softmax_ref(const std::vector<float>& x, int64_t rows, int64_t cols,
                              const std::function<int64_t(int64_t row)>& valid_of = {}) {
  SoftmaxRef r;
  r.cols = cols;
  r.y.assign(x.size(), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t n = valid_of ? valid_of(i) : cols;
    const float* xr = x.data() + i * cols;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t k = 0; k < n; ++k) m = xr[k] > m ? xr[k] : m;
    double s = 0.0;
    for (int64_t k = 0; k < n; ++k) s += std::exp(static_cast<double>(xr[k] - m));
    for (int64_t k = 0; k < n; ++k) r.y[i * cols + k] = std::exp(static_cast<double>(xr[k] - m)) / s;
    r.valid.push_back(n);
    r.max.push_back(m);
    r.lse.push_back(std::log(s));
  }
  return r;
}

/// The number of chained adds in a row sum over n values: the CPU's n, or a GPU group's.
using SumTerms = std::function<int64_t(int64_t n)>;
inline int64_t cpu_sum_terms(int64_t n) { return n; }

/// The allowed error of softmax output e in dtype dt (the header's bound).
inline std::function<double(int64_t)> softmax_bound(const SoftmaxRef& ref, DType dt, SumTerms terms) {
  return [&ref, dt, terms](int64_t e) {
    const int64_t n = ref.valid[static_cast<size_t>(ref.row_of(e))];
    return (static_cast<double>(terms(n) + 20) * kU + store_rel(dt)) * std::fabs(ref.y[static_cast<size_t>(e)]) +
           store_abs(dt);
  };
}

/// dx = y·(dy - dot), dot = sum(dy·y) over each row's valid prefix, in double
/// of the float products (both twins round each product alike: the GPU's adds
/// are __fadd_rn, never fused); 0 after the prefix. `ref` gives the rows' prefixes.
struct SoftmaxGradRef {
  std::vector<double> dx, dot, mag;  // dx per element; dot and sum|dy·y| per row
};
inline SoftmaxGradRef softmax_grad_ref(const SoftmaxRef& ref, const std::vector<float>& y,
                                       const std::vector<float>& dy) {
  const int64_t cols = ref.cols, rows = static_cast<int64_t>(ref.valid.size());
  SoftmaxGradRef g;
  g.dx.assign(y.size(), 0.0);
  g.dot.assign(static_cast<size_t>(rows), 0.0);
  g.mag.assign(static_cast<size_t>(rows), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t n = ref.valid[static_cast<size_t>(i)];
    for (int64_t k = 0; k < n; ++k) {
      const float term = dy[i * cols + k] * y[i * cols + k];
      g.dot[i] += term;
      g.mag[i] += std::fabs(term);
    }
    for (int64_t k = 0; k < n; ++k) g.dx[i * cols + k] = y[i * cols + k] * (dy[i * cols + k] - g.dot[i]);
  }
  return g;
}

/// The allowed error of softmax_grad's dx[e] in dtype dt (the header's bound);
/// 0 after a row's prefix, where dx is exactly 0 whatever dy holds there.
inline std::function<double(int64_t)> softmax_grad_bound(const SoftmaxRef& ref, const SoftmaxGradRef& g,
                                                         const std::vector<float>& y, const std::vector<float>& dy,
                                                         DType dt, SumTerms terms) {
  return [&ref, &g, &y, &dy, dt, terms](int64_t e) {
    if (ref.masked(e)) return 0.0;
    const size_t i = static_cast<size_t>(ref.row_of(e)), ue = static_cast<size_t>(e);
    return std::fabs(y[ue]) * (static_cast<double>(terms(ref.valid[i])) * kU * g.mag[i] +
                               2 * kU * (std::fabs(dy[ue]) + std::fabs(g.dot[i]))) +
           (2 * kU + store_rel(dt)) * std::fabs(g.dx[ue]) + store_abs(dt);
  };
}

/// Cross-entropy's loss per row in double, lse + max - x[label], and the
/// magnitudes its bound scales; rows whose label is `ignore` are 0.
struct LossRef {
  std::vector<double> loss, mag;
};
inline LossRef cross_entropy_loss_ref(const SoftmaxRef& ref, const std::vector<float>& x,
                                      const std::vector<int64_t>& labels, int64_t ignore) {
  LossRef l;
  l.loss.assign(labels.size(), 0.0);
  l.mag.assign(labels.size(), 0.0);
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] == ignore) continue;
    const double xl = x[static_cast<size_t>(static_cast<int64_t>(i) * ref.cols + labels[i])];
    l.loss[i] = ref.lse[i] + ref.max[i] - xl;
    l.mag[i] = std::fabs(ref.lse[i]) + std::fabs(ref.max[i]) + std::fabs(xl);
  }
  return l;
}
/// The allowed error of row i's loss in dtype dt (the header's bound).
inline std::function<double(int64_t)> cross_entropy_loss_bound(const SoftmaxRef& ref, const LossRef& l, DType dt,
                                                               SumTerms terms) {
  return [&ref, &l, dt, terms](int64_t i) {
    const size_t r = static_cast<size_t>(i);
    return static_cast<double>(terms(ref.valid[r]) + 8) * kU + 4 * kU * l.mag[r] +
           store_rel(dt) * std::fabs(l.loss[r]) + store_abs(dt);
  };
}

/// Every element of t at the listed flat positions is exactly +0 (bit pattern 0).
inline void expect_exact_zeros(const Tensor& t, const std::vector<int64_t>& at, const std::string& what) {
  INFO(what);
  const size_t es = dtype_size(t.dtype());
  int64_t bad = 0;
  for (int64_t i : at) {
    const auto* p = static_cast<const unsigned char*>(t.raw()) + static_cast<size_t>(i) * es;
    for (size_t b = 0; b < es; ++b)
      if (p[b] != 0) {
        ++bad;
        break;
      }
  }
  INFO(bad << " of " << at.size() << " masked elements are not +0");
  CHECK(bad == 0);
}

}  // namespace mix::testing
