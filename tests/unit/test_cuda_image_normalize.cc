// [cuda] image_normalize's CUDA kernel (runtime/ops/cuda/image_normalize.cu)
// against its CPU twin: every pixel value, channels first and last, FP32, FP16
// and BF16 outputs, bit for bit. Both run fn::NormalizePixel (IEEE division
// and subtraction, no multiply to contract into an FMA) and round once on
// store with the same conversion, so there is no tolerance.
// Without a GPU (or in a build without CUDA) the test exits 77, which CTest
// reports as skipped, never as passed.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "runtime/core/random.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/require_gpu.h"

using namespace mix;

TEST_CASE("image_normalize on CUDA is identical to the CPU, both layouts, every output dtype",
          "[cuda][image_normalize]") {
  mix::testing::require_gpu();
#ifdef MIX_HAVE_CUDA
  struct Case {
    Shape x;  // [N, H, W, C]
    std::vector<double> mean, stddev;
  };
  const std::vector<double> kMean = {0.485, 0.456, 0.406}, kStd = {0.229, 0.224, 0.225};
  const Case cases[] = {
      {{3, 17, 17, 3}, kMean, kStd},                                 // RGB, planes not a multiple of a warp
      {{2, 224, 224, 3}, kMean, kStd},                               // ImageNet-sized, many blocks
      {{2, 5, 9, 1}, {0.286}, {0.353}},                              // one channel, not square
      {{1, 6, 4, 4}, {0.5, 0.4, 0.3, 0.0}, {0.25, 0.5, 1.0, -2.0}},  // four channels, a negative std
  };
  uint64_t seed = 1;
  for (const Case& c : cases) {
    Tensor pixels = Tensor::empty(c.x, DType::u8);
    Rng rng(seed++);
    for (int64_t i = 0; i < pixels.numel(); ++i)
      pixels.data<uint8_t>()[i] = static_cast<uint8_t>(i < 256 ? i : rng.below(256));  // 0, 1, 2, ... first
    for (const std::string layout : {"NCHW", "NHWC"})
      for (DType t : mix::testing::kFloatTypes) {
        const std::string what = shape_str(c.x) + " " + layout + " " + std::string(dtype_name(t));
        mix::testing::OneOp op{make_op("image_normalize", {{"X", {"x"}}}, {{"Out", {"out"}}},
                                       {{"mean", c.mean},
                                        {"std", c.stddev},
                                        {"data_format", layout},
                                        {"out_dtype", std::string(dtype_name(t))}}),
                               {{"x", pixels}}};
        const mix::testing::Both r = mix::testing::run_both(op, {"out"});
        mix::testing::expect_identical(r.gpu.at("out"), r.cpu.at("out"), what);
      }
  }
#endif
}
