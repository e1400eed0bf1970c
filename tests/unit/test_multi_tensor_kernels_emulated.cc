// The multi-tensor launch's kernels (runtime/cuda/multi_tensor_kernels.cuh)
// and the bodies of grad_global_norm, clip_by_global_norm and clip_by_value
// (runtime/optim/cuda/clip_grad_kernels.cuh), their very source, run on the
// CPU (tests/unit/cuda_emulation.h) in the launches that
// for_each_multi_tensor_launch plans, as launch_multi_tensor launches them
// on the GPU. The gradients are 131, so the shared launches need two tables
// of up to 128: an empty one; sizes under one run of 1024 elements, of
// several runs, and of two chunks of 16384 and a bit, each cut short; and one
// past multi_tensor::kLargeTensor, launched alone in blocks of 1024. Compared
// with the CPU twins as test_cuda_ops compares the GPU: the norm to an FP32
// ulp (both round an FP64 sum to FP32 once), the clips bit for bit (the same
// functors on the same values). grad_global_norm runs in every training
// step, so this is its kernels' check on every build; test_cuda_ops checks
// the GPU itself where one is lent.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "collective/communicator.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/multi_tensor_plan.h"
#include "runtime/ops/grad_accumulate.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/emulated_tensors.h"

// The emulation and its multi-tensor launch, then the kernels (cuda_emulation.h
// defines CUDA's keywords as macros).
#include "tests/unit/emulated_multi_tensor_launch.h"

#include "collective/cuda/bucket_copy_kernels.cuh"
#include "runtime/ops/cuda/fused_cast_kernels.cuh"
#include "runtime/ops/cuda/grad_accumulate_kernels.cuh"
#include "runtime/optim/cuda/clip_grad_kernels.cuh"  // and multi_tensor_kernels.cuh

using namespace mix;
using namespace mix::testing;
namespace kernels = mix::cuda;

namespace {

struct Gradients {
  std::vector<std::string> names;
  std::vector<std::pair<std::string, Tensor>> feeds;
};
// 131 FP32 gradients, values up to 7e4 (squares far past FP32's sums'
// precision): number 7 empty, number 100 launched alone, every tenth from
// number 3 over two chunks and a bit of a third, the rest 1 to 5000 elements.
Gradients gradients() {
  Gradients g;
  for (int i = 0; i < 131; ++i) {
    const int64_t n = i == 7        ? 0
                      : i == 100    ? multi_tensor::kLargeTensor + 5
                      : i % 10 == 3 ? 2 * multi_tensor::kChunk + 1 + i
                                    : 1 + (i * 397) % 5000;
    g.names.push_back(numbered("g", static_cast<size_t>(i)));
    g.feeds.push_back({g.names.back(), uniform_tensor({n}, 700 + static_cast<uint64_t>(i), -7e4f, 7e4f)});
  }
  return g;
}

// The gradients above but the one launched alone: the tensors of the shared launches, all of them.
Gradients shared_launch_gradients() {
  Gradients g;
  for (auto& [name, t] : gradients().feeds) {
    if (multi_tensor::launched_alone(t.numel())) continue;
    g.names.push_back(name);
    g.feeds.push_back({name, t});
  }
  REQUIRE(g.names.size() == 130);
  return g;
}

std::vector<std::vector<float>> values(const std::vector<std::pair<std::string, Tensor>>& feeds) {
  std::vector<std::vector<float>> v;
  for (const auto& [name, t] : feeds) v.push_back(values_of<float>(t));
  return v;
}

// grad_global_norm as clip_grad.cu runs it: each tensor's runs of kRun
// elements into slots of their own, then one block over the slots. The slots
// start as NaN (the launcher zeroes them), so a run no block wrote shows.
float emulated_norm(std::vector<std::vector<float>>& gs, Launches& launches) {
  std::vector<int64_t> first_slot;
  int64_t slots = 0;
  for (const auto& g : gs) {
    first_slot.push_back(slots);
    slots += (static_cast<int64_t>(g.size()) + kernels::kRun - 1) / kernels::kRun;
  }
  std::vector<double> partial(static_cast<size_t>(slots), NAN);
  kernels::TensorList<2> list;
  for (size_t i = 0; i < gs.size(); ++i)
    list.add({gs[i].data(), partial.data() + first_slot[i]}, static_cast<int64_t>(gs[i].size()));
  launches = emulated_multi_tensor<2>(list, kernels::SquareSums{});
  float norm = NAN;
  emulated::run_grid(
      1, 1, [&] { kernels::finish_norm(partial.data(), slots, &norm); }, kernels::kMultiTensorThreads);
  return norm;
}

kernels::TensorList<1> list_of(std::vector<std::vector<float>>& gs) {
  kernels::TensorList<1> list;
  for (auto& g : gs) list.add({g.data()}, static_cast<int64_t>(g.size()));
  return list;
}

void expect_gradients(const std::vector<std::vector<float>>& got, const std::map<std::string, Tensor>& cpu,
                      const Gradients& g, const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i)
    expect_same_bits(got[i], values_of<float>(cpu.at(g.names[i])), what + " " + g.names[i]);
}

}  // namespace

TEST_CASE(
    "grad_global_norm and the clips, emulated over many tensors: the CPU's norm to an FP32 ulp, the clips bit for "
    "bit",
    "[clip][multi_tensor][emulated]") {
  const Gradients g = gradients();

  std::vector<std::vector<float>> gs = values(g.feeds);
  Launches launches;
  const float norm = emulated_norm(gs, launches);
  CHECK(launches.alone == 1);   // number 100
  CHECK(launches.shared == 2);  // 129 tensors in tables of 128
  const OpDesc norm_op = make_op("grad_global_norm", {{"X", g.names}}, {{"Norm", {"norm"}}});
  const float cpu_norm = run_ops_on({norm_op}, g.feeds, cpu_device(), ExecEnv{}, {"norm"}).at("norm").data<float>()[0];
  // As test_cuda_ops: both round an FP64 sum of ~4.5e6 squares to FP32, in
  // different orders, ~4.5e6 * 2^-53 apart relative, far below FP32's half
  // ulp: the same FP32 value or, at a tie's edge, the next.
  INFO("norm " << norm << ", the CPU's " << cpu_norm);
  CHECK(std::fabs(norm - cpu_norm) <= std::nextafter(cpu_norm, INFINITY) - cpu_norm);

  // clip_by_global_norm from one norm on both twins (finite, then infinite:
  // nothing scaled, the flag raised), with no incoming flag and with the AMP
  // step's raised.
  for (const float n : {cpu_norm, INFINITY}) {
    INFO("norm " << n);
    std::vector<std::pair<std::string, Tensor>> with_norm = g.feeds;
    with_norm.push_back({"norm", Tensor::from_floats({1}, {n})});
    const OpDesc clip = make_op("clip_by_global_norm", {{"X", g.names}, {"Norm", {"norm"}}},
                                {{"Out", g.names}, {"FoundInfiniteOut", {"found_inf"}}}, {{"max_norm", 1e3}});
    std::vector<std::string> results = g.names;
    results.push_back("found_inf");
    const auto cpu = run_ops_on({clip}, with_norm, cpu_device(), ExecEnv{}, results);

    std::vector<std::vector<float>> clipped = values(g.feeds);
    int32_t found = -1;
    kernels::raise_if_not_finite(&n, nullptr, &found);
    CHECK(found == cpu.at("found_inf").data<int32_t>()[0]);
    CHECK(found == (std::isfinite(n) ? 0 : 1));
    const int32_t amp_found = 1;
    kernels::raise_if_not_finite(&n, &amp_found, &found);
    CHECK(found == 1);
    emulated_multi_tensor<1>(list_of(clipped), kernels::ScaleByCoefficient{&n, 1e3f});
    expect_gradients(clipped, cpu, g, "clip_by_global_norm");
  }

  // clip_by_value, with NaN, infinities and signed zeros among the values.
  std::vector<std::pair<std::string, Tensor>> special;
  for (const auto& [name, t] : g.feeds) special.push_back({name, with_specials(t, DType::f32)});
  const OpDesc clamp = make_op("clip_by_value", {{"X", g.names}}, {{"Out", g.names}}, {{"max_value", 1e4}});
  const auto cpu = run_ops_on({clamp}, special, cpu_device(), ExecEnv{}, g.names);
  std::vector<std::vector<float>> clamped = values(special);
  emulated_multi_tensor<1>(list_of(clamped), kernels::ClampChunk{fn::ClipByValue{1e4f}});
  expect_gradients(clamped, cpu, g, "clip_by_value");
}

TEST_CASE("grad_accumulate's body, emulated over many tensors: the CPU's bits, add and finish",
          "[grad_accum][multi_tensor][emulated]") {
  // The gradients above but those launched alone (their launch is the clips'
  // and the norm's above; this body indexes them as it indexes the others,
  // and three dtypes of one would take the emulation long), as X of the three
  // micro-batches, with overflow, NaN and signed zeros; the accumulators
  // start from FP32 values of their own. Two micro-batches added, then the
  // last one's finish: X = Accum + X rounded once, Accum zeroed.
  const Gradients g = shared_launch_gradients();
  std::vector<std::string> accs;
  std::vector<std::pair<std::string, Tensor>> acc_feeds;
  for (size_t i = 0; i < g.names.size(); ++i) {
    accs.push_back(grad_accumulator_name(g.names[i]));
    acc_feeds.push_back({accs.back(), uniform_tensor(g.feeds[i].second.shape(), 900 + i, -1e3f, 1e3f)});
  }
  for (DType dt : kFloatTypes) {
    INFO(dname(dt));
    // Micro-batch m's X: the gradients in dt, with specials, each batch its own values.
    std::vector<std::vector<std::pair<std::string, Tensor>>> batches(3);
    for (int m = 0; m < 3; ++m)
      for (size_t i = 0; i < g.names.size(); ++i)
        batches[m].push_back(
            {g.names[i] + "_" + std::to_string(m),
             with_specials(uniform_tensor(g.feeds[i].second.shape(), 300 + 200 * m + i, -7e4f, 7e4f), dt)});
    std::vector<std::pair<std::string, Tensor>> feeds = acc_feeds;
    std::vector<std::string> last;
    for (int m = 0; m < 3; ++m)
      for (const auto& [name, t] : batches[m]) {
        feeds.push_back({name, t});
        if (m == 2) last.push_back(name);
      }
    auto accumulate = [&](int m, const char* mode) {
      std::vector<std::string> xs;
      for (const auto& [name, t] : batches[m]) xs.push_back(name);
      std::map<std::string, std::vector<std::string>> outs{{"AccumOut", accs}};
      if (std::string(mode) == "finish") outs["Out"] = xs;
      return make_op("grad_accumulate", {{"X", xs}, {"Accum", accs}}, outs, {{"mode", std::string(mode)}});
    };
    std::vector<std::string> results = accs;
    results.insert(results.end(), last.begin(), last.end());
    const auto cpu_adds =
        run_ops_on({accumulate(0, "add"), accumulate(1, "add")}, feeds, cpu_device(), ExecEnv{}, accs);
    const auto cpu = run_ops_on({accumulate(0, "add"), accumulate(1, "add"), accumulate(2, "finish")}, feeds,
                                cpu_device(), ExecEnv{}, results);

    cpu::dispatch_floating(dt, [&](auto tag) {
      using T = decltype(tag);
      std::vector<std::vector<float>> acc = values(acc_feeds);
      std::vector<std::vector<std::vector<T>>> xs(3);
      for (int m = 0; m < 3; ++m)
        for (const auto& [name, t] : batches[m]) xs[m].push_back(values_of<T>(t));
      for (int m = 0; m < 3; ++m) {
        kernels::TensorList<2> list;
        for (size_t i = 0; i < acc.size(); ++i)
          list.add({xs[m][i].data(), acc[i].data()}, static_cast<int64_t>(acc[i].size()));
        if (m < 2)
          emulated_multi_tensor<2>(list, kernels::AccumulateChunk<T, false>{});
        else
          emulated_multi_tensor<2>(list, kernels::AccumulateChunk<T, true>{});
        if (m == 1)
          for (size_t i = 0; i < acc.size(); ++i)
            expect_same_bits(acc[i], values_of<float>(cpu_adds.at(accs[i])),
                             "the accumulator after two adds, " + accs[i]);
      }
      for (size_t i = 0; i < acc.size(); ++i) {
        expect_same_bits(acc[i], values_of<float>(cpu.at(accs[i])), "the accumulator after finish (zeros), " + accs[i]);
        expect_same_bits(xs[2][i], values_of<T>(cpu.at(last[i])), "X after finish, " + last[i]);
      }
    });
  }
}

TEST_CASE("fused_cast's body, emulated over many tensors: the CPU's bits between every pair of dtypes",
          "[fused_cast][multi_tensor][emulated]") {
  // The shared launches' tensors (the launch alone is the clips' and the
  // norm's above), with specials: values past FP16's range, NaN, infinities,
  // subnormals and signed zeros, stored in the source dtype.
  const Gradients g = shared_launch_gradients();
  std::vector<std::string> outs;
  for (const std::string& name : g.names) outs.push_back(name + "_cast");
  for (DType from : kFloatTypes)
    for (DType to : kFloatTypes) {
      if (from == to) continue;
      const std::string what = "fused_cast " + dname(from) + " -> " + dname(to);
      INFO(what);
      std::vector<std::pair<std::string, Tensor>> feeds;
      for (const auto& [name, t] : g.feeds) feeds.push_back({name, with_specials(t, from)});
      const auto cpu =
          run_ops_on({make_op("fused_cast", {{"X", g.names}}, {{"Out", outs}}, {{"out_dtype", dname(to)}})}, feeds,
                     cpu_device(), ExecEnv{}, outs);
      cpu::dispatch_floating(from, [&](auto from_tag) {
        using From = decltype(from_tag);
        cpu::dispatch_floating(to, [&](auto to_tag) {
          using To = decltype(to_tag);
          std::vector<std::vector<From>> xs;
          std::vector<std::vector<To>> got;
          kernels::TensorList<2> list;
          for (const auto& [name, t] : feeds) {
            xs.push_back(values_of<From>(t));
            got.emplace_back(xs.back().size(), from_float<To>(-3.f));  // shows an element no block wrote
          }
          for (size_t i = 0; i < xs.size(); ++i)
            list.add({xs[i].data(), got[i].data()}, static_cast<int64_t>(xs[i].size()));
          const Launches launches = emulated_multi_tensor<2>(list, kernels::FusedCastChunk<From, To>{});
          CHECK(launches.shared > 1);
          for (size_t i = 0; i < got.size(); ++i)
            expect_same_bits(got[i], values_of<To>(cpu.at(outs[i])), what + ", " + outs[i]);
        });
      });
    }
}

// The bucket copies of c_allreduce_sum as allreduce_op.cu runs them on one
// rank: the tensors packed back to back into a buffer times `prescale`, the
// buffer (a one-rank sum leaves it as it is) unpacked into them times
// `postscale`. Zero-size tensors take no copy. T: the dtype's storage type.
template <typename T>
Launches emulated_bucket_round_trip(std::vector<std::vector<T>>& xs, DType dt, float prescale, float postscale) {
  size_t total = 0;
  for (const auto& x : xs) total += x.size();
  std::vector<T> buffer(total);
  Launches launches;
  for (bool pack : {true, false}) {
    kernels::TensorList<2> copies;
    size_t offset = 0;
    for (auto& x : xs) {
      if (!x.empty()) {
        T* slot = buffer.data() + offset;
        copies.add(pack ? std::array<void*, 2>{x.data(), slot} : std::array<void*, 2>{slot, x.data()},
                   static_cast<int64_t>(x.size()));
      }
      offset += x.size();
    }
    collective::with_bucket_copy(dt, pack ? prescale : postscale, [&](auto body) {
      const Launches n = emulated_multi_tensor<2>(copies, body);
      launches.shared += n.shared;
      launches.alone += n.alone;
    });
  }
  return launches;
}

TEST_CASE("the all-reduce's bucket copies, emulated: the CPU op's bits, scaled and plain",
          "[collective][multi_tensor][emulated]") {
  // The shared launches' tensors with specials, as one bucket of c_allreduce_sum
  // on one rank: prescaled by 1/3 (a rounding in every dtype) and postscaled
  // by 3, or both 1 (a copy of the bits); and as integers, copied.
  const Gradients g = shared_launch_gradients();
  auto comm = collective::make_local_communicator();
  ExecEnv env;
  env.comm = comm.get();
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::i64})
    for (bool scaled : {true, false}) {
      if (dt == DType::i64 && scaled) continue;  // integer buckets take no scaling
      const std::string what = dname(dt) + (scaled ? ", prescale 1/3, postscale 3" : ", no scaling");
      INFO(what);
      const float prescale = scaled ? 1.f / 3.f : 1.f, postscale = scaled ? 3.f : 1.f;
      std::vector<std::pair<std::string, Tensor>> feeds;
      for (const auto& [name, t] : g.feeds) {
        Tensor v = with_specials(t, dt == DType::i64 ? DType::f32 : dt);
        if (dt == DType::i64) {  // the values as integers, past 2^31 some of them
          Tensor i = Tensor::empty(v.shape(), DType::i64);
          for (int64_t k = 0; k < v.numel(); ++k) i.data<int64_t>()[k] = (k * 7919 - 5) * 1000003;
          v = i;
        }
        feeds.push_back({name, v});
      }
      std::map<std::string, Attr> attrs;
      if (scaled) attrs = {{"prescale", double{prescale}}, {"postscale", double{postscale}}};
      const auto cpu = run_ops_on({make_op("c_allreduce_sum", {{"X", g.names}}, {{"Out", g.names}}, attrs)}, feeds,
                                  cpu_device(), env, g.names);
      auto check = [&](auto tag) {
        using T = decltype(tag);
        std::vector<std::vector<T>> xs;
        for (const auto& [name, t] : feeds) xs.push_back(values_of<T>(t));
        CHECK(emulated_bucket_round_trip<T>(xs, dt, prescale, postscale).shared > 2);
        for (size_t i = 0; i < xs.size(); ++i)
          expect_same_bits(xs[i], values_of<T>(cpu.at(g.names[i])), what + ", " + g.names[i]);
      };
      if (dt == DType::i64)
        check(int64_t{});
      else
        cpu::dispatch_floating(dt, check);
    }
  CHECK_THROWS_WITH(collective::with_bucket_copy(DType::i64, 0.5f, [](auto) {}),
                    Catch::Contains("cannot scale a i64 bucket"));
}
