#pragma once
// Inputs for top1_correct's tests (test_top1_correct.cc on the CPU, the
// [cuda] case in test_cuda_ops.cc) and the count they should give, found by a
// plain loop written apart from fn::argmax_key: a row with a NaN misses;
// otherwise its prediction is the first index holding its largest value.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/core/tensor.h"
#include "tests/unit/cuda_compare.h"

namespace mix::testing {

struct Top1Case {
  Tensor logits, label;  // label: one class per row, i64 or i32
  int64_t expected = 0;  // correct rows by the plain loop
};

/// Class indices `v` in a tensor of shape `s` and dtype `dt` (i64 or i32).
inline Tensor labels(const Shape& s, const std::vector<int64_t>& v, DType dt = DType::i64) {
  Tensor t = Tensor::empty(s, dt);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::i64)
      t.data<int64_t>()[i] = v[i];
    else
      t.data<int32_t>()[i] = static_cast<int32_t>(v[i]);
  }
  return t;
}

/// The first index of the row's largest value, or -1 when the row holds a NaN.
inline int64_t plain_argmax(const std::vector<float>& v, int64_t begin, int64_t n) {
  int64_t best = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (std::isnan(v[begin + j])) return -1;
    if (v[begin + j] > v[begin + best]) best = j;
  }
  return best;
}

/// rows x classes logits in `dt` drawn from a handful of levels (so most rows
/// hold ties), with zeros of both signs, infinities and a NaN at fixed places.
/// Even rows are labelled with the plain argmax (the prediction is right
/// unless the row holds a NaN), odd rows with a class drawn at random from
/// [-1, classes] (mostly wrong; -1 and `classes` never match).
inline Top1Case top1_case(int64_t rows, int64_t classes, DType dt, DType label_dt, uint64_t seed) {
  Top1Case c;
  std::vector<float> v = uniform_tensor({rows, classes}, seed, -2.f, 2.f).to_floats();
  for (float& x : v) x = std::floor(x) * 0.75f;  // -1.5, -0.75, 0, 0.75: exact in every dtype
  // Some zeros become the smallest subnormals of FP32, which must rank above
  // (or below) zero on the GPU as on the CPU: no flush to zero. (FP16 and
  // BF16 round them back to zero.)
  for (size_t i = 0; i < v.size(); i += 5)
    if (v[i] == 0.f) v[i] = i % 2 ? 1e-45f : -1e-45f;
  c.logits = with_specials(Tensor::from_floats({rows, classes}, v), dt);
  const std::vector<float> stored = c.logits.to_floats();
  const std::vector<float> pick = uniform_tensor({rows}, seed + 1, -1.f, static_cast<float>(classes) + 1.f).to_floats();
  std::vector<int64_t> want(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t best = plain_argmax(stored, r * classes, classes);
    const int64_t label = r % 2 == 0 ? std::max<int64_t>(best, 0) : static_cast<int64_t>(std::floor(pick[r]));
    want[static_cast<size_t>(r)] = label;
    c.expected += best >= 0 && best == label;
  }
  c.label = labels({rows}, want, label_dt);
  return c;
}

}  // namespace mix::testing
