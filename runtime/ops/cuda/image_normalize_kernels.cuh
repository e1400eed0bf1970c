#pragma once
// image_normalize's kernel (image_normalize.cu's header says what it
// computes). Like row_group.cuh it needs no CUDA header, so
// tests/unit/test_image_normalize_kernels_emulated.cc runs this same source
// on the CPU.
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/ops/image_normalize_attrs.h"

namespace mix::cuda {

/// The map over the batch's pixels, launched by grid stride: pixel q (image
/// n = q / pixels, place i = q % pixels in it) writes its C values.
template <typename T>
struct NormalizePixels {
  const uint8_t* x;
  T* out;
  image_normalize_rules::Params p;
  int64_t pixels;  // H * W
  __device__ void operator()(int64_t q) const {
    const int64_t channels = p.channels;
    const uint8_t* in = x + q * channels;
    if (p.channels_last) {
      for (int64_t c = 0; c < channels; ++c) out[q * channels + c] = from_float<T>(p.per_channel[c](in[c]));
      return;
    }
    const int64_t n = q / pixels, i = q - n * pixels;
    T* first_plane = out + n * channels * pixels + i;
    for (int64_t c = 0; c < channels; ++c) first_plane[c * pixels] = from_float<T>(p.per_channel[c](in[c]));
  }
};

}  // namespace mix::cuda
