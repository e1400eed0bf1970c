#pragma once
// The maps of cast (between integer dtypes, and i64 to f32), fill_constant and
// fill_like_scalar (cast_scale_fill.cu launches them; cast between floating
// dtypes and scale are maps.cuh's). Like row_group.cuh they need no CUDA
// header, so tests/unit/test_cast_fill_kernels_emulated.cc runs this same
// source on the CPU.
#include <cstdint>

#include "runtime/core/half.h"

namespace mix::cuda {

/// out[i] = To(x[i]): C++'s conversion, as the CPU's cast of integers.
template <typename From, typename To>
struct IntCast {
  const From* x;
  To* out;
  __device__ void operator()(int64_t i) const { out[i] = static_cast<To>(x[i]); }
};

/// out[i] = value, rounded once to T.
template <typename T>
struct FillConstant {
  T* out;
  float value;
  __device__ void operator()(int64_t i) const { out[i] = from_float<T>(value); }
};

/// out[i] = x[0] * multiplier, rounded once to T: the scalar is read on the
/// device (no host round trip).
template <typename T>
struct FillLikeScalar {
  const T* x;
  T* out;
  float multiplier;
  __device__ void operator()(int64_t i) const { out[i] = from_float<T>(to_float(x[0]) * multiplier); }
};

}  // namespace mix::cuda
