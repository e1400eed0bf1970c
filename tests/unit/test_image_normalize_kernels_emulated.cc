// image_normalize's CUDA kernel (runtime/ops/cuda/image_normalize_kernels.cuh),
// its very source, run on the CPU (tests/unit/cuda_emulation.h) and launched
// as image_normalize.cu launches it, against its CPU twin: every pixel value,
// channels first and last, FP32, FP16 and BF16 outputs, bit for bit (both
// run fn::NormalizePixel and round once on store, so there is no tolerance).
// It runs everywhere, so a change to the kernel's layouts or its planes'
// indexing is checked on every build; test_cuda_image_normalize checks the
// GPU itself where one is lent.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/random.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/ops/image_normalize_attrs.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/emulated_tensors.h"

// The emulation and its map launches, then the kernel (cuda_emulation.h
// defines CUDA's keywords as macros).
#include "tests/unit/emulated_map_launch.h"

#include "runtime/ops/cuda/image_normalize_kernels.cuh"

using namespace mix;
using namespace mix::testing;
namespace kernels = mix::cuda;

TEST_CASE("image_normalize's kernel, emulated: the CPU's bits in both layouts and every output dtype",
          "[emulated][image_normalize]") {
  struct Case {
    Shape x;  // [N, H, W, C]
    std::vector<double> mean, stddev;
  };
  const std::vector<double> kMean = {0.485, 0.456, 0.406}, kStd = {0.229, 0.224, 0.225};
  const Case cases[] = {
      {{3, 17, 17, 3}, kMean, kStd},                                 // RGB, planes not a multiple of a warp
      {{2, 5, 9, 1}, {0.286}, {0.353}},                              // one channel, not square
      {{1, 6, 4, 4}, {0.5, 0.4, 0.3, 0.0}, {0.25, 0.5, 1.0, -2.0}},  // four channels, a negative std
  };
  uint64_t seed = 1;
  for (const Case& c : cases) {
    Tensor pixels = Tensor::empty(c.x, DType::u8);
    Rng rng(seed++);
    for (int64_t i = 0; i < pixels.numel(); ++i)
      pixels.data<uint8_t>()[i] = static_cast<uint8_t>(i < 256 ? i : rng.below(256));  // every value 0, 1, ... first
    const int64_t images = c.x[0], image_pixels = c.x[1] * c.x[2];
    for (const std::string layout : {"NCHW", "NHWC"})
      for (DType t : kFloatTypes) {
        const std::string what = shape_str(c.x) + " " + layout + " " + dname(t);
        INFO(what);
        const OpDesc op =
            make_op("image_normalize", {{"X", {"x"}}}, {{"Out", {"out"}}},
                    {{"mean", c.mean}, {"std", c.stddev}, {"data_format", layout}, {"out_dtype", dname(t)}});
        const Tensor want = run_ops_on({op}, {{"x", pixels}}, cpu_device(), ExecEnv{}, {"out"}).at("out");
        const image_normalize_rules::Params p = image_normalize_rules::params(op, DType::u8, c.x);
        cpu::dispatch_floating(t, [&](auto tag) {
          using T = decltype(tag);
          std::vector<T> out(static_cast<size_t>(pixels.numel()), from_float<T>(NAN));
          emulated_grid_stride(images * image_pixels,
                               kernels::NormalizePixels<T>{pixels.data<uint8_t>(), out.data(), p, image_pixels});
          expect_identical(tensor_of(out, want.shape(), t), want, what);
        });
      }
  }
}
