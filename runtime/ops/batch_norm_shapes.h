#pragma once
// batch_norm's view of X, shared by its CPU kernel and its cuDNN launcher:
// [N, C, spatial...] with the statistics per channel over N and the spatial dims,
// or [N, spatial..., C] with the attr data_layout NHWC (channels last,
// runtime/ops/data_format.h). A 2-D X [N, C] is the same in both.
#include <cstdint>

#include "runtime/core/check.h"
#include "runtime/core/tensor.h"
#include "runtime/ir/program.h"
#include "runtime/ops/data_format.h"

namespace mix {

struct BatchNormDims {
  int64_t n, c, spatial;  // X viewed as [n, c, spatial], or [n, spatial, c] channels last
  bool channels_last;
};

/// Whether the op's X is channels last (attr data_layout, Paddle's name).
inline bool batch_norm_channels_last(const OpDesc& op) { return channels_last_attr(op, "data_layout"); }

/// The channel count of X (dim 1, or the last dim channels last); X needs at least [N, C].
inline int64_t batch_norm_channels(const Shape& x, bool channels_last) {
  const char* expected = channels_last ? "[N, ..., C]" : "[N, C, ...]";
  MIX_CHECK(x.size() >= 2, "batch_norm: X must be " << expected << " with C > 0, got " << shape_str(x));
  const int64_t c = channels_last ? x.back() : x[1];
  MIX_CHECK(c > 0, "batch_norm: X must be " << expected << " with C > 0, got " << shape_str(x));
  return c;
}

inline BatchNormDims batch_norm_dims(const Shape& x, bool channels_last) {
  const int64_t c = batch_norm_channels(x, channels_last);
  int64_t spatial = 1;
  for (size_t i = 1; i < x.size(); ++i) spatial *= x[i];
  return {x[0], c, spatial / c, channels_last};
}

}  // namespace mix
