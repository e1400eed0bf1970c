#pragma once
// image_normalize's cases shared by the GPU's test (test_cuda_image_normalize.cc)
// and the emulated kernel's (test_image_normalize_kernels_emulated.cc): batches
// whose pixels take every byte value, and the op over them.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/random.h"
#include "runtime/core/tensor.h"
#include "runtime/ir/program.h"
#include "tests/unit/cuda_compare.h"

namespace mix::testing {

struct ImageNormalizeCase {
  Shape x;  // [N, H, W, C]
  std::vector<double> mean, stddev;
};

/// RGB planes not a multiple of a warp, one channel not square, four channels
/// with a negative std; `imagenet_sized` adds a batch of 224 x 224 RGB images
/// (many blocks, for the GPU).
inline std::vector<ImageNormalizeCase> image_normalize_cases(bool imagenet_sized) {
  const std::vector<double> mean = {0.485, 0.456, 0.406}, stddev = {0.229, 0.224, 0.225};
  std::vector<ImageNormalizeCase> cases = {
      {{3, 17, 17, 3}, mean, stddev},
      {{2, 5, 9, 1}, {0.286}, {0.353}},
      {{1, 6, 4, 4}, {0.5, 0.4, 0.3, 0.0}, {0.25, 0.5, 1.0, -2.0}},
  };
  if (imagenet_sized) cases.push_back({{2, 224, 224, 3}, mean, stddev});
  return cases;
}

/// u8 pixels of shape x: 0, 1, 2, ... for the first 256, then drawn at random.
inline Tensor every_byte_pixels(const Shape& x, uint64_t seed) {
  Tensor pixels = Tensor::empty(x, DType::u8);
  Rng rng(seed);
  for (int64_t i = 0; i < pixels.numel(); ++i)
    pixels.data<uint8_t>()[i] = static_cast<uint8_t>(i < 256 ? i : rng.below(256));
  return pixels;
}

/// image_normalize of X "x" into "out", in `layout` (NCHW or NHWC) and dtype t.
inline OpDesc image_normalize_op(const ImageNormalizeCase& c, const std::string& layout, DType t) {
  return make_op("image_normalize", {{"X", {"x"}}}, {{"Out", {"out"}}},
                 {{"mean", c.mean}, {"std", c.stddev}, {"data_format", layout}, {"out_dtype", dname(t)}});
}

}  // namespace mix::testing
