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

#include "tests/unit/cuda_compare.h"
#include "tests/unit/image_normalize_cases.h"
#include "tests/unit/require_gpu.h"

using namespace mix;

TEST_CASE("image_normalize on CUDA is identical to the CPU, both layouts, every output dtype",
          "[cuda][image_normalize]") {
  mix::testing::require_gpu();
#ifdef MIX_HAVE_CUDA
  uint64_t seed = 1;
  for (const mix::testing::ImageNormalizeCase& c : mix::testing::image_normalize_cases(true)) {
    const Tensor pixels = mix::testing::every_byte_pixels(c.x, seed++);
    for (const std::string layout : {"NCHW", "NHWC"})
      for (DType t : mix::testing::kFloatTypes) {
        const std::string what = shape_str(c.x) + " " + layout + " " + std::string(dtype_name(t));
        mix::testing::OneOp op{mix::testing::image_normalize_op(c, layout, t), {{"x", pixels}}};
        const mix::testing::Both r = mix::testing::run_both(op, {"out"});
        mix::testing::expect_identical(r.gpu.at("out"), r.cpu.at("out"), what);
      }
  }
#endif
}
