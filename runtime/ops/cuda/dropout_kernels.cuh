#pragma once
// The kernels of dropout and dropout_grad (dropout.cu's header says what they
// compute and why the GPU's bits are the CPU's): grid-stride maps. Like
// row_group.cuh they need no CUDA header, so
// tests/unit/test_dropout_kernels_emulated.cc runs this same source on the CPU.
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/kernels/dropout_mask.h"

namespace mix::cuda {

/// The mask key from the step in device memory (ExecEnv::device_step), into
/// `key`; parts: dropout_rules::mask_key_parts. One thread's work.
struct DropoutMaskKeyOnDevice {
  const int64_t* step;
  uint64_t seed, rank, name_hash;
  uint64_t* key;
  __device__ void operator()(int64_t) const {
    *key = fn::dropout_key(seed, static_cast<uint64_t>(*step), rank, name_hash);
  }
};

/// mask[i] = keep(key, i); out[i] = x[i] * keep * scale. mask may be null (not
/// wanted). The key is `key_on_device[0]` when that is given, else `key`.
template <typename T>
struct DropoutForward {
  const T* x;
  T* out;
  uint8_t* mask;
  uint64_t key;
  const uint64_t* key_on_device;
  float p;
  fn::DropoutApply f;
  __device__ void operator()(int64_t i) const {
    const uint64_t k = key_on_device ? *key_on_device : key;
    const uint8_t keep = fn::dropout_keep(k, static_cast<uint64_t>(i), p) ? 1 : 0;
    if (mask) mask[i] = keep;
    out[i] = from_float<T>(f(to_float(x[i]), keep));
  }
};

/// dx[i] = dout[i] * mask[i] * scale.
template <typename T>
struct DropoutBackward {
  const T* dout;
  const uint8_t* mask;
  T* dx;
  fn::DropoutApply f;
  __device__ void operator()(int64_t i) const { dx[i] = from_float<T>(f(to_float(dout[i]), mask[i])); }
};

}  // namespace mix::cuda
