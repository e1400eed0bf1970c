#pragma once
// The Y gradients of elementwise_add and elementwise_mul (column sums over
// [pre, n, post], runtime/ops/broadcast.h) against the same sums in double:
// shared by the GPU's test (test_cuda_ops.cc) and the emulated kernels'
// (test_elementwise_kernels_emulated.cc). A sum of k sequential adds (per
// thread, per chunk) and tree levels is within (k + levels)·u·sum|terms| of
// the double sum, then one rounding on store to dY's dtype.
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/ops/broadcast.h"
#include "tests/unit/cuda_compare.h"

namespace mix::testing {

struct ColumnSumRef {
  std::vector<double> sum, magnitude;  // per column j: sum of the terms, sum of their magnitudes
};

/// The terms dout[p, j, q] (elementwise_add_grad), or dout·x as FP32 rounds
/// the product (elementwise_mul_grad, x not null), summed in double.
inline ColumnSumRef column_sum_ref(const BroadcastDims& d, const std::vector<float>& dout,
                                   const std::vector<float>* x) {
  ColumnSumRef r{std::vector<double>(static_cast<size_t>(d.n), 0.0),
                 std::vector<double>(static_cast<size_t>(d.n), 0.0)};
  for (int64_t p = 0; p < d.pre; ++p)
    for (int64_t j = 0; j < d.n; ++j)
      for (int64_t q = 0; q < d.post; ++q) {
        const auto i = static_cast<size_t>((p * d.n + j) * d.post + q);
        const float term = x ? dout[i] * (*x)[i] : dout[i];
        r.sum[static_cast<size_t>(j)] += term;
        r.magnitude[static_cast<size_t>(j)] += std::fabs(term);
      }
  return r;
}

/// What a column may be off by when its sum took `terms` rounding steps
/// (sequential adds plus tree levels) and was stored as `dt`.
inline std::function<double(int64_t)> column_sum_bound(const ColumnSumRef& r, double terms, DType dt) {
  return [&r, terms, dt](int64_t j) {
    const auto k = static_cast<size_t>(j);
    return terms * kU * r.magnitude[k] + store_rel(dt) * std::fabs(r.sum[k]) + store_abs(dt);
  };
}

}  // namespace mix::testing
