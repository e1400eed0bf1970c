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

#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/ops/image_normalize_attrs.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/emulated_tensors.h"
#include "tests/unit/image_normalize_cases.h"

// The emulation and its map launches, then the kernel (cuda_emulation.h
// defines CUDA's keywords as macros).
#include "tests/unit/emulated_map_launch.h"

#include "runtime/ops/cuda/image_normalize_kernels.cuh"

using namespace mix;
using namespace mix::testing;
namespace kernels = mix::cuda;

TEST_CASE("image_normalize's kernel, emulated: the CPU's bits in both layouts and every output dtype",
          "[emulated][image_normalize]") {
  uint64_t seed = 1;
  for (const ImageNormalizeCase& c : image_normalize_cases(false)) {
    const Tensor pixels = every_byte_pixels(c.x, seed++);
    const int64_t images = c.x[0], image_pixels = c.x[1] * c.x[2];
    for (const std::string layout : {"NCHW", "NHWC"})
      for (DType t : kFloatTypes) {
        const std::string what = shape_str(c.x) + " " + layout + " " + dname(t);
        INFO(what);
        const OpDesc op = image_normalize_op(c, layout, t);
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
