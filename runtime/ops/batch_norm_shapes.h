#pragma once
// batch_norm's view of X, shared by its CPU kernel and its cuDNN launcher:
// [N, C, spatial...] with the statistics per channel over N and the spatial dims.
#include <cstdint>

#include "runtime/check.h"
#include "runtime/tensor.h"

namespace mix {

struct BatchNormDims {
  int64_t n, c, spatial;  // X viewed as [n, c, spatial]
};

/// The channel count of X (dim 1); X needs at least [N, C].
inline int64_t batch_norm_channels(const Shape& x) {
  MIX_CHECK(x.size() >= 2 && x[1] > 0, "batch_norm: X must be [N, C, ...] with C > 0, got " << shape_str(x));
  return x[1];
}

inline BatchNormDims batch_norm_dims(const Shape& x) {
  const int64_t c = batch_norm_channels(x);
  int64_t spatial = 1;
  for (size_t i = 2; i < x.size(); ++i) spatial *= x[i];
  return {x[0], c, spatial};
}

}  // namespace mix
