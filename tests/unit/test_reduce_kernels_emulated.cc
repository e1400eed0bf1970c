// The CUDA kernels of sum, fused_sum_relu_grad, mean and mean_grad
// (runtime/ops/cuda/sum_chunks_kernels.cuh, reduce_kernels.cuh), their very
// source, run on the CPU (tests/unit/cuda_emulation.h) and launched as
// sum_chunks.cuh and reduce.cu launch them. It runs everywhere, so a change
// to the chunks of inputs, the packs or mean's two passes is checked on every
// build; test_cuda_ops checks the GPU itself where one is lent.
//
// What is compared:
//  - sum and fused_sum_relu_grad give the CPU twin's bits (FP32 adds in input
//    order, one rounding on store, on both sides): one input, a few, exactly
//    one launch's worth (8), and more (the FP32 accumulator between
//    launches), in place (Out over the first input) too, on arrays aligned as
//    device memory is and one element past it;
//  - mean within the bound of its own order of double additions
//    (mean_check.h), which a missed or repeated element exceeds;
//    mean_grad the CPU twin's bits (dOut / n in double, one rounding).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/emulated_tensors.h"
#include "tests/unit/mean_check.h"

// The emulation and its map launches, then the kernels (cuda_emulation.h
// defines CUDA's keywords as macros).
#include "tests/unit/emulated_map_launch.h"

#include "runtime/ops/cuda/reduce_kernels.cuh"
#include "runtime/ops/cuda/sum_chunks_kernels.cuh"

using namespace mix;
using namespace mix::testing;
namespace kernels = mix::cuda;

namespace {

// The sum of xs (masked by relu's gradient at relu_out, unless null) by the
// emulated kernel, launched chunk by chunk as sum_into launches it; in place:
// Out is the first input's array.
template <typename T>
Tensor emulated_sum(const std::vector<Tensor>& xs, const Tensor* relu_out, bool in_place, int offset) {
  const auto n = static_cast<size_t>(xs[0].numel());
  const DType dt = xs[0].dtype();
  std::vector<Placed<T>> in;
  for (const Tensor& x : xs) in.emplace_back(values_of<T>(x), offset, dt);
  Placed<T> out(std::vector<T>(n, from_float<T>(NAN)), offset, dt);
  T* out_p = in_place ? in[0].p : out.p;
  Placed<float> acc(std::vector<float>(n, NAN), offset, DType::f32);
  const Placed<T> relu(relu_out ? values_of<T>(*relu_out) : std::vector<T>{}, offset, dt);
  kernels::for_each_sum_chunk(
      in.size(), [&](size_t k) { return static_cast<const T*>(in[k].p); }, acc.p, out_p, relu_out ? relu.p : nullptr,
      [&](const kernels::SumChunk<T>& f) { emulated_packed<kernels::kPackWidth<T>>(static_cast<int64_t>(n), f); });
  return tensor_of(in_place ? in[0].values(n) : out.values(n), xs[0].shape(), dt);
}

Tensor emulated_sum(const std::vector<Tensor>& xs, const Tensor* relu_out, bool in_place, int offset) {
  Tensor r;
  cpu::dispatch_floating(xs[0].dtype(),
                         [&](auto tag) { r = emulated_sum<decltype(tag)>(xs, relu_out, in_place, offset); });
  return r;
}

}  // namespace

TEST_CASE("emulated sum and fused_sum_relu_grad give the CPU's bits, in place too", "[emulated][sum]") {
  // 33 x 65: whole packs and a tail; 2 x 1024: packs only; 1 x 3: fewer
  // elements than a pack.
  for (DType dt : kFloatTypes)
    for (const Shape& s : {Shape{33, 65}, Shape{2, 1024}, Shape{1, 3}})
      for (int k : {1, 3, 8, 9, 17}) {  // past 8 inputs: launches joined by the FP32 accumulator
        std::vector<Tensor> xs;
        std::vector<std::pair<std::string, Tensor>> feeds;
        std::vector<std::string> names;
        for (int i = 0; i < k; ++i) {
          xs.push_back(random_tensor(s, dt, 200 + static_cast<uint64_t>(i), -10.f, 10.f));
          names.push_back(numbered("x", static_cast<size_t>(i)));
          feeds.push_back({names.back(), xs.back()});
        }
        const Tensor relu_out = with_specials(uniform_tensor(s, 3, -1.f, 1.f), dt);
        const Tensor cpu_sum =
            run_ops_on({make_op("sum", {{"X", names}}, {{"Out", {"y"}}})}, feeds, cpu_device(), ExecEnv{}, {"y"})
                .at("y");
        std::vector<std::pair<std::string, Tensor>> relu_feeds = feeds;
        relu_feeds.push_back({"out", relu_out});
        const Tensor cpu_relu_grad =
            run_ops_on({make_op("fused_sum_relu_grad", {{"Out", {"out"}}, {"Out@GRAD", names}}, {{"X@GRAD", {"dx"}}})},
                       relu_feeds, cpu_device(), ExecEnv{}, {"dx"})
                .at("dx");
        for (int offset : {0, 1})
          for (bool in_place : {false, true}) {
            const std::string what = std::to_string(k) + " " + dname(dt) + shape_str(s) +
                                     (in_place ? " in place" : "") + (offset ? ", one element past alignment" : "");
            expect_identical(emulated_sum(xs, nullptr, in_place, offset), cpu_sum, "sum of " + what);
            expect_identical(emulated_sum(xs, &relu_out, in_place, offset), cpu_relu_grad,
                             "fused_sum_relu_grad of " + what);
          }
      }
}

namespace {

template <typename T>
Tensor emulated_mean(const Tensor& x) {
  const int64_t n = x.numel();
  const std::vector<T> xv = values_of<T>(x);
  const int blocks = kernels::mean_blocks(n);
  std::vector<double> partial(static_cast<size_t>(blocks), NAN);
  std::vector<T> out(1, from_float<T>(NAN));
  emulated::run_grid(
      static_cast<unsigned>(blocks), 1, [&] { kernels::mean_partial_sums<T>(xv.data(), n, partial.data()); },
      kernels::kBlock);
  emulated::run_grid(
      1, 1, [&] { kernels::mean_finish<T>(partial.data(), blocks, n, out.data()); }, kernels::kBlock);
  return tensor_of(out, {1}, x.dtype());
}

template <typename T>
Tensor emulated_mean_grad(const Tensor& x, const Tensor& dout) {
  std::vector<T> dx(static_cast<size_t>(x.numel()), from_float<T>(NAN));
  emulated_grid_stride(x.numel(),
                       kernels::MeanGradFill<T>{kernels::ScalarRef{dout.raw(), dout.dtype()}, x.numel(), dx.data()});
  return tensor_of(dx, x.shape(), x.dtype());
}

}  // namespace

TEST_CASE("emulated mean within its bound of the exact mean, mean_grad the CPU's bits", "[emulated][mean]") {
  // One element; one block; 52 blocks, most threads adding 8 elements, the
  // last block part-full.
  for (DType dt : kFloatTypes)
    for (const Shape& s : {Shape{1}, Shape{1000}, Shape{317, 331}}) {
      const Tensor x = random_tensor(s, dt, 41, -1.f, 3.f);
      const int64_t n = x.numel();
      const std::string what = dname(dt) + " of " + std::to_string(n);
      INFO(what);
      const Tensor cpu_mean =
          run_ops_on({make_op("mean", {{"X", {"x"}}}, {{"Out", {"y"}}})}, {{"x", x}}, cpu_device(), ExecEnv{}, {"y"})
              .at("y");
      const Tensor dout = floats({1}, {0.7f}, dt);
      const Tensor cpu_grad =
          run_ops_on({make_op("mean_grad", {{"X", {"x"}}, {"Out@GRAD", {"dout"}}}, {{"X@GRAD", {"dx"}}})},
                     {{"x", x}, {"dout", dout}}, cpu_device(), ExecEnv{}, {"dx"})
              .at("dx");
      const MeanRef ref = mean_ref(x);
      cpu::dispatch_floating(dt, [&](auto tag) {
        using T = decltype(tag);
        expect_within(emulated_mean<T>(x), ref.mean, mean_bound(ref, gpu_mean_terms(n), dt), "mean (emulated)");
        expect_identical(emulated_mean_grad<T>(x, dout), cpu_grad, "mean_grad (emulated)");
      });
      expect_within(cpu_mean, ref.mean, mean_bound(ref, static_cast<double>(n), dt), "mean (CPU)");
    }
}
