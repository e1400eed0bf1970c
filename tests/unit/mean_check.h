#pragma once
// mean's result against the sum in long double (a 64-bit mantissa: exact to
// about n·2^-64), shared by the GPU's test (test_cuda_ops.cc) and the emulated
// kernels' (test_reduce_kernels_emulated.cc). A double sum of k sequential
// adds (and tree levels) is within k·2^-53·sum|x|; divided by n, then one
// rounding on store to the output's dtype.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/core/tensor.h"
#include "tests/unit/cuda_compare.h"

namespace mix::testing {

struct MeanRef {
  std::vector<double> mean;  // one value, as expect_within takes it
  double abs_mean = 0.0;     // mean |x|
};

inline MeanRef mean_ref(const Tensor& x) {
  long double sum = 0, abs_sum = 0;
  for (float v : x.to_floats()) {
    sum += v;
    abs_sum += std::fabs(v);
  }
  const auto n = static_cast<long double>(x.numel());
  return {{static_cast<double>(sum / n)}, static_cast<double>(abs_sum / n)};
}

/// What a mean whose double sum took `terms` rounding steps, stored as dt, may be off by.
inline std::function<double(int64_t)> mean_bound(const MeanRef& r, double terms, DType dt) {
  return [&r, terms, dt](int64_t) { return terms * 0x1p-53 * r.abs_mean + store_err(dt, r.mean[0]); };
}

/// The GPU's rounding steps (runtime/ops/cuda/reduce_kernels.cuh): blocks =
/// clamp(ceil(n / 2048), 1, 1024) of 256 threads, ceil(n / (blocks·256)) adds
/// a thread, two 8-level trees, ceil(blocks / 256) adds a thread in the second
/// pass, and 8 more of slack.
inline double gpu_mean_terms(int64_t n) {
  const int64_t blocks = std::min<int64_t>(std::max<int64_t>((n + 2047) / 2048, 1), 1024);
  const int64_t per_thread = (n + blocks * 256 - 1) / (blocks * 256);
  return static_cast<double>(per_thread + 16 + (blocks + 255) / 256 + 8);
}

}  // namespace mix::testing
