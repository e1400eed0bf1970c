// The maps of cast between integers (and i64 to f32), fill_constant and
// fill_like_scalar (runtime/ops/cuda/cast_scale_fill_kernels.cuh), their very
// source, run on the CPU (tests/unit/cuda_emulation.h) by grid stride as
// cast_scale_fill.cu launches them, bit for bit against the CPU's ops: integers
// past i32's range and past f32's exact ones, fills that round in FP16 and
// BF16, and fill_like_scalar's loss-scale seed (X[0] times 1/K).
// test_cuda_ops checks the GPU itself where one is lent.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/kernels/cpu_loops.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/emulated_tensors.h"

// The emulation and its map launches, then the kernels (cuda_emulation.h
// defines CUDA's keywords as macros).
#include "tests/unit/emulated_map_launch.h"

#include "runtime/ops/cuda/cast_scale_fill_kernels.cuh"

using namespace mix;
using namespace mix::testing;
namespace cu = mix::cuda;

namespace {

// The CPU's op with one input X (none when `x` is empty) and output Out.
Tensor cpu_op(const std::string& type, const Tensor* x, std::map<std::string, Attr> attrs) {
  std::map<std::string, std::vector<std::string>> ins;
  std::vector<std::pair<std::string, Tensor>> feeds;
  if (x) {
    ins["X"] = {"x"};
    feeds.push_back({"x", *x});
  }
  return run_ops_on({make_op(type, ins, {{"Out", {"out"}}}, std::move(attrs))}, feeds, cpu_device(), ExecEnv{}, {"out"})
      .at("out");
}

template <typename From, typename To>
void check_int_cast(const std::vector<From>& values, DType from, DType to) {
  const std::string what = "cast " + dname(from) + " -> " + dname(to);
  INFO(what);
  const Tensor x = tensor_of(values, {static_cast<int64_t>(values.size())}, from);
  std::vector<To> got(values.size());
  emulated_grid_stride(static_cast<int64_t>(values.size()), cu::IntCast<From, To>{values.data(), got.data()});
  expect_same_bits(got, values_of<To>(cpu_op("cast", &x, {{"out_dtype", dname(to)}})), what);
}

}  // namespace

TEST_CASE("emulated integer casts give the CPU's values", "[emulated][cast]") {
  // 1000 values around 0, past i32's range both ways, and past 2^24 (where f32 rounds).
  std::vector<int64_t> wide;
  for (int64_t k = 0; k < 1000; ++k) wide.push_back((k - 500) * 9876543211 + (k % 7) * 16777217);
  check_int_cast<int64_t, int32_t>(wide, DType::i64, DType::i32);
  check_int_cast<int64_t, float>(wide, DType::i64, DType::f32);
  std::vector<int32_t> narrow;
  for (int32_t k = 0; k < 1000; ++k) narrow.push_back((k - 500) * 4194301);
  check_int_cast<int32_t, int64_t>(narrow, DType::i32, DType::i64);
}

TEST_CASE("emulated fill_constant and fill_like_scalar give the CPU's bits", "[emulated][fill]") {
  const Shape shape{3, 333};  // several blocks, the last part-full
  const auto n = static_cast<size_t>(shape_numel(shape));
  auto check = [&](auto tag, DType dt) {
    using T = decltype(tag);
    // 0.1 rounds in every dtype; 70000 overflows FP16.
    for (float value : {0.1f, -70000.f}) {
      const std::string what = "fill_constant " + dname(dt) + " " + std::to_string(value);
      INFO(what);
      std::vector<T> got(n, from_float<T>(NAN));
      emulated_grid_stride(static_cast<int64_t>(n), cu::FillConstant<T>{got.data(), value});
      const Tensor want =
          cpu_op("fill_constant", nullptr,
                 {{"shape", std::vector<int64_t>(shape)}, {"dtype", dname(dt)}, {"value", double{value}}});
      expect_same_bits(got, values_of<T>(want), what);
    }
    // The loss scale 65536 (an FP32 X) or a loss of 3.3 (X's own dtype) seeding
    // loss@GRAD, times 1/K for K = 3 micro-batches.
    const Tensor x = floats({2}, {dt == DType::f32 ? 65536.f : 3.3f, 9.f}, dt);
    const std::string what = "fill_like_scalar " + dname(dt);
    INFO(what);
    const std::vector<T> xv = values_of<T>(x);
    std::vector<T> got(n, from_float<T>(NAN));
    emulated_grid_stride(static_cast<int64_t>(n), cu::FillLikeScalar<T>{xv.data(), got.data(), 1.f / 3.f});
    const Tensor want =
        cpu_op("fill_like_scalar", &x, {{"shape", std::vector<int64_t>(shape)}, {"multiplier", double{1.f / 3.f}}});
    expect_same_bits(got, values_of<T>(want), what);
  };
  check(float{}, DType::f32);
  check(half_t{}, DType::f16);
  check(bf16_t{}, DType::bf16);
}
