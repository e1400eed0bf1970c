// The kernels of the AMP step's own ops, their very source, run on the CPU
// (tests/unit/cuda_emulation.h) as their .cu files launch them:
// check_finite_and_unscale and cast_check_finite_and_unscale, whose chunks
// unscale and raise FoundInfinite (amp/cuda/amp_kernels.cuh);
// update_loss_scaling's one thread (the same file); and the optimizers'
// updates, sgd, momentum and adamw, with increment_step
// (runtime/optim/cuda/update_kernels.cuh), and any_flag, which joins the
// overflow and outlier flags into SkipUpdate (skip_update_kernels.cuh). It runs everywhere, so a change to
// their indexing, their flags or their skipped steps is checked on every
// build; test_cuda_ops checks the GPU itself where one is lent.
//
// What is compared, with the CPU twins, bit for bit: the host compiler fuses
// no multiply-add (the GPU's FMAs are why test_cuda_ops allows a few
// roundings there), so the same functors on the same values give the same
// bits. The unscale: Out, FoundInfinite and FoundInfiniteEach over tensors in
// shared launches and one launched alone, finite, with an inf, with a NaN,
// and with FoundInfiniteIn set; a scale that is not positive and finite (the
// CPU op refuses it) raises the flag. The scaler: every output over a run of
// steps that grows and shrinks the scale. The updates: every parameter and
// state, and with SkipUpdate set nothing changes, nor does the step count.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "amp/loss_scaler.h"
#include "runtime/core/half.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/multi_tensor_plan.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/emulated_tensors.h"
#include "tests/unit/loss_scaling_op.h"

// The emulation and its launches, then the kernels (cuda_emulation.h defines
// CUDA's keywords as macros).
#include "tests/unit/emulated_map_launch.h"
#include "tests/unit/emulated_multi_tensor_launch.h"

#include "amp/cuda/amp_kernels.cuh"
#include "runtime/optim/cuda/skip_update_kernels.cuh"
#include "runtime/optim/cuda/update_kernels.cuh"

using namespace mix;
using namespace mix::testing;
namespace kernels = mix::cuda;

namespace {

Tensor i32_scalar(int32_t v) {
  Tensor t = Tensor::empty({1}, DType::i32);
  t.data<int32_t>()[0] = v;
  return t;
}
Tensor i64_scalar(int64_t v) {
  Tensor t = Tensor::empty({1}, DType::i64);
  t.data<int64_t>()[0] = v;
  return t;
}

// ---- check_finite_and_unscale ----------------------------------------------------------------

// Sizes: empty, one element, shared launches' chunks cut short, and (when
// `alone`) one past multi_tensor::kLargeTensor, launched by itself.
std::vector<int64_t> unscale_sizes(bool alone) {
  std::vector<int64_t> n = {1000, 0, 1, 2 * multi_tensor::kChunk + 3, 5000, 77};
  if (alone) n.push_back(multi_tensor::kLargeTensor + 5);
  return n;
}

struct UnscaleRun {
  std::vector<Tensor> out;
  int32_t found = -1;
  std::vector<int32_t> each;
};

// The op's kernels as amp_ops.cu's run_unscale launches them for one group of
// (In, Out) dtypes: InitFoundInf, FoundInfiniteEach zeroed, the chunks.
template <typename In, typename Out>
UnscaleRun emulated_unscale(const std::vector<Tensor>& xs, float scale, const Tensor* found_in, DType out_dtype) {
  UnscaleRun r;
  r.each.assign(xs.size(), 0);
  std::vector<std::vector<In>> x;
  std::vector<std::vector<Out>> out;
  for (const Tensor& t : xs) {
    x.push_back(values_of<In>(t));
    out.emplace_back(static_cast<size_t>(t.numel()), from_float<Out>(-7.f));
  }
  const kernels::ScalarRef prev =
      found_in ? kernels::ScalarRef{found_in->raw(), found_in->dtype()} : kernels::ScalarRef{};
  emulated_grid_stride(1, amp::InitFoundInf{&r.found, prev, &scale});
  kernels::TensorList<2> list;
  for (size_t i = 0; i < xs.size(); ++i) list.put(i, {x[i].data(), out[i].data()}, xs[i].numel());
  emulated_multi_tensor<2>(list, amp::UnscaleCheckChunk<In, Out>{&scale, &r.found, r.each.data()});
  for (size_t i = 0; i < xs.size(); ++i) r.out.push_back(tensor_of(out[i], xs[i].shape(), out_dtype));
  return r;
}

template <typename In, typename Out>
void check_unscale(DType in_dt, DType out_dt, bool alone) {
  const bool cast = in_dt != out_dt;
  const std::string type = cast ? "cast_check_finite_and_unscale" : "check_finite_and_unscale";
  // What the gradients hold: all finite; an inf in the third; a NaN late in the
  // fourth's second chunk and an inf in the last (with `alone`, the one
  // launched alone: thousands of emulated blocks, so that case only); finite
  // with FoundInfiniteIn set.
  enum class Held { finite, inf, nan_and_inf, finite_flag_in };
  for (Held held : {Held::finite, Held::inf, Held::nan_and_inf, Held::finite_flag_in}) {
    const std::vector<int64_t> sizes = unscale_sizes(alone && held == Held::nan_and_inf);
    std::vector<Tensor> xs;
    std::vector<std::string> names, outs;
    std::vector<std::pair<std::string, Tensor>> feeds{{"scale", Tensor::from_floats({1}, {1024.f})}};
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<float> v = uniform_tensor({sizes[i]}, 300 + i, -6e4f, 6e4f).to_floats();
      if (held == Held::inf && i == 2) v[0] = -INFINITY;
      if (held == Held::nan_and_inf && i == 3) v[static_cast<size_t>(multi_tensor::kChunk + 5)] = NAN;
      if (held == Held::nan_and_inf && i + 1 == sizes.size()) v.back() = INFINITY;
      xs.push_back(floats({sizes[i]}, v, in_dt));
      names.push_back(numbered("x", i));
      outs.push_back(cast ? numbered("y", i) : names.back());
      feeds.push_back({names.back(), xs.back()});
    }
    std::map<std::string, std::vector<std::string>> ins{{"X", names}, {"Scale", {"scale"}}};
    const Tensor flag_in = i32_scalar(1);
    if (held == Held::finite_flag_in) {
      ins["FoundInfiniteIn"] = {"found_in"};
      feeds.push_back({"found_in", flag_in});
    }
    std::vector<std::string> fetch = outs;
    fetch.push_back("found");
    fetch.push_back("each");
    const auto cpu =
        run_ops_on({make_op(type, ins, {{"Out", outs}, {"FoundInfinite", {"found"}}, {"FoundInfiniteEach", {"each"}}})},
                   feeds, cpu_device(), ExecEnv{}, fetch);
    const UnscaleRun r =
        emulated_unscale<In, Out>(xs, 1024.f, held == Held::finite_flag_in ? &flag_in : nullptr, out_dt);
    const std::string what = type + " " + dname(in_dt) + (alone ? ", one launched alone" : "") + ", held " +
                             std::to_string(static_cast<int>(held));
    INFO(what);
    for (size_t i = 0; i < xs.size(); ++i) expect_identical(r.out[i], cpu.at(outs[i]), what + ", Out " + outs[i]);
    CHECK(r.found == cpu.at("found").data<int32_t>()[0]);
    CHECK(r.found == (held == Held::finite ? 0 : 1));
    const std::vector<int32_t> each_cpu = values_of<int32_t>(cpu.at("each"));
    CHECK(r.each == each_cpu);
    // Not vacuous: the flags name the tensors that held an inf or NaN, and those only.
    for (size_t i = 0; i < xs.size(); ++i) {
      const bool bad = (held == Held::inf && i == 2) || (held == Held::nan_and_inf && (i == 3 || i + 1 == xs.size()));
      CHECK(r.each[i] == (bad ? 1 : 0));
    }
  }
  // A scale that is not positive and finite raises the flag (the CPU op refuses it).
  for (float bad_scale : {0.f, -1.f, INFINITY, NAN}) {
    INFO("scale " << bad_scale);
    const std::vector<Tensor> xs{floats({3}, {1.f, 2.f, 3.f}, in_dt)};
    CHECK(emulated_unscale<In, Out>(xs, bad_scale, nullptr, out_dt).found == 1);
  }
}

}  // namespace

TEST_CASE("check_finite_and_unscale's kernels, emulated: the CPU's Out bits and flags", "[amp][emulated]") {
  check_unscale<float, float>(DType::f32, DType::f32, true);
  check_unscale<half_t, half_t>(DType::f16, DType::f16, false);
  check_unscale<half_t, float>(DType::f16, DType::f32, true);  // the FP16 gradients' cast to FP32, fused
  check_unscale<bf16_t, float>(DType::bf16, DType::f32, false);
}

// ---- update_loss_scaling ----------------------------------------------------------------------

TEST_CASE("update_loss_scaling's kernel, emulated: the CPU's state after every step", "[amp][emulated]") {
  const std::map<std::string, Attr> attrs{{"incr_every_n_steps", 3},
                                          {"decr_every_n_nan_or_inf", 2},
                                          {"incr_ratio", 2.0},
                                          {"decr_ratio", 0.5},
                                          {"min_loss_scaling", 1.0}};
  const OpDesc op = update_loss_scaling_op("found", {"scale", "good", "bad", "skipped", "at_min"}, attrs);
  const amp::LossScalingParams params = amp::to_params(amp::from_op_attrs(op));
  float scale = 65536.f;
  int64_t good = 0, bad = 0, skipped = 0, at_min = 0;
  // Good steps that grow the scale, single and paired overflows that shrink it.
  const int found_steps[] = {0, 0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0};
  bool grew = false, shrank = false;
  for (int found : found_steps) {
    const auto cpu = run_ops_on({op},
                                {{"found", i32_scalar(found)},
                                 {"scale", Tensor::from_floats({1}, {scale})},
                                 {"good", i64_scalar(good)},
                                 {"bad", i64_scalar(bad)},
                                 {"skipped", i64_scalar(skipped)},
                                 {"at_min", i64_scalar(at_min)}},
                                cpu_device(), ExecEnv{}, {"scale", "good", "bad", "skipped", "at_min"});
    // The kernel in place, as the step runs it (outputs alias inputs).
    const int32_t flag = found;
    const float before = scale;
    emulated_grid_stride(1, amp::LossScalingUpdate{kernels::ScalarRef{&flag, DType::i32}, &scale, &good, &bad, &skipped,
                                                   &at_min, &scale, &good, &bad, &skipped, &at_min, params});
    INFO("found " << found << ", scale " << before);
    CHECK(scale == cpu.at("scale").data<float>()[0]);
    CHECK(good == cpu.at("good").data<int64_t>()[0]);
    CHECK(bad == cpu.at("bad").data<int64_t>()[0]);
    CHECK(skipped == cpu.at("skipped").data<int64_t>()[0]);
    CHECK(at_min == cpu.at("at_min").data<int64_t>()[0]);
    grew = grew || scale > before;
    shrank = shrank || scale < before;
  }
  CHECK(grew);  // the run took both ways
  CHECK(shrank);
  CHECK(skipped == 7);
}

// ---- the optimizers -----------------------------------------------------------------------------

namespace {

struct UpdateKind {
  const char* type;
  std::vector<std::pair<const char*, const char*>> state;  // input slot, output slot
  std::map<std::string, Attr> attrs;
};

// The emulated update of params (and their state) by `kind`; lr 0.01, step 3.
void emulated_update(const UpdateKind& kind, std::vector<std::vector<float>>& p,
                     std::vector<std::vector<std::vector<float>>>& state, std::vector<std::vector<float>>& g,
                     int32_t skip, int64_t step) {
  const float lr = 0.01f;
  const kernels::ScalarRef skip_ref{&skip, DType::i32};
  const std::string type = kind.type;
  const auto attr = [&](const char* name) { return std::get<double>(kind.attrs.at(name)); };
  if (type == "sgd") {
    kernels::TensorList<2> list;
    for (size_t i = 0; i < p.size(); ++i) list.add({p[i].data(), g[i].data()}, static_cast<int64_t>(p[i].size()));
    emulated_multi_tensor<2>(list, kernels::SgdChunk{&lr, skip_ref, static_cast<float>(attr("weight_decay"))});
  } else if (type == "momentum") {
    kernels::TensorList<3> list;
    for (size_t i = 0; i < p.size(); ++i)
      list.add({p[i].data(), state[0][i].data(), g[i].data()}, static_cast<int64_t>(p[i].size()));
    emulated_multi_tensor<3>(list, kernels::MomentumChunk{&lr, skip_ref, static_cast<float>(attr("mu")),
                                                          static_cast<float>(attr("weight_decay")),
                                                          std::get<bool>(kind.attrs.at("use_nesterov"))});
  } else {
    kernels::TensorList<4> list;
    for (size_t i = 0; i < p.size(); ++i)
      list.add({p[i].data(), state[0][i].data(), state[1][i].data(), g[i].data()}, static_cast<int64_t>(p[i].size()));
    emulated_multi_tensor<4>(
        list, kernels::AdamWChunk{&lr, &step, skip_ref, attr("beta1"), attr("beta2"),
                                  static_cast<float>(attr("epsilon")), static_cast<float>(attr("weight_decay"))});
  }
}

}  // namespace

TEST_CASE("the optimizers' update bodies, emulated over many parameters: the CPU's bits, nothing when skipped",
          "[optim][emulated]") {
  // Parameters sharing the launches' tables, one empty, chunks cut short.
  const std::vector<int64_t> sizes = {300, 1, 0, 2 * multi_tensor::kChunk + 9, 4097, 64};
  const UpdateKind kinds[] = {
      {"sgd", {}, {{"weight_decay", 0.01}}},
      {"momentum", {{"Velocity", "VelocityOut"}}, {{"mu", 0.9}, {"weight_decay", 0.01}, {"use_nesterov", false}}},
      {"momentum", {{"Velocity", "VelocityOut"}}, {{"mu", 0.9}, {"weight_decay", 0.01}, {"use_nesterov", true}}},
      {"adamw",
       {{"Moment1", "Moment1Out"}, {"Moment2", "Moment2Out"}},
       {{"beta1", 0.9}, {"beta2", 0.999}, {"epsilon", 1e-8}, {"weight_decay", 0.01}}}};
  for (const UpdateKind& kind : kinds)
    for (int32_t skip : {0, 1}) {
      const std::string what = std::string(kind.type) + (skip ? " (skipped)" : "");
      INFO(what);
      std::vector<std::pair<std::string, Tensor>> feeds{
          {"lr", Tensor::from_floats({1}, {0.01f})}, {"skip", i32_scalar(skip)}, {"t", i64_scalar(3)}};
      std::map<std::string, std::vector<std::string>> ins{{"LearningRate", {"lr"}}, {"SkipUpdate", {"skip"}}};
      std::map<std::string, std::vector<std::string>> outs;
      std::vector<std::string> results;
      std::vector<std::vector<float>> p, g;
      std::vector<std::vector<std::vector<float>>> state(kind.state.size());
      for (size_t k = 0; k < sizes.size(); ++k) {
        const Tensor pk = uniform_tensor({sizes[k]}, 800 + k, -2.f, 2.f), gk = uniform_tensor({sizes[k]}, 900 + k);
        feeds.push_back({numbered("p", k), pk});
        feeds.push_back({numbered("g", k), gk});
        ins["Param"].push_back(numbered("p", k));
        ins["Grad"].push_back(numbered("g", k));
        outs["ParamOut"].push_back(numbered("p", k));
        results.push_back(numbered("p", k));
        p.push_back(values_of<float>(pk));
        g.push_back(values_of<float>(gk));
        for (size_t s = 0; s < kind.state.size(); ++s) {
          const auto [in_slot, out_slot] = kind.state[s];
          // Second moments must be non-negative; the first moment and velocity any sign.
          const float lo = std::string(in_slot) == "Moment2" ? 0.f : -0.1f;
          const Tensor sk = uniform_tensor({sizes[k]}, 1000 + 7 * k + s, lo, 0.1f);
          feeds.push_back({numbered(in_slot, k), sk});
          ins[in_slot].push_back(numbered(in_slot, k));
          outs[out_slot].push_back(numbered(in_slot, k));
          results.push_back(numbered(in_slot, k));
          state[s].push_back(values_of<float>(sk));
        }
      }
      if (std::string(kind.type) == "adamw") ins["Step"] = {"t"};
      const auto cpu = run_ops_on({make_op(kind.type, ins, outs, kind.attrs)}, feeds, cpu_device(), ExecEnv{}, results);
      const std::vector<std::vector<float>> p_before = p;
      emulated_update(kind, p, state, g, skip, 3);
      for (size_t k = 0; k < sizes.size(); ++k) {
        expect_same_bits(p[k], values_of<float>(cpu.at(numbered("p", k))), what + " p" + std::to_string(k));
        for (size_t s = 0; s < kind.state.size(); ++s)
          expect_same_bits(state[s][k], values_of<float>(cpu.at(numbered(kind.state[s].first, k))),
                           what + " " + kind.state[s].first + std::to_string(k));
      }
      CHECK((p == p_before) == (skip == 1));  // the update happened, unless skipped
    }
  // increment_step: one more, unless the step is skipped.
  for (int32_t skip : {0, 1}) {
    int64_t step = 41;
    emulated_grid_stride(1, kernels::IncrementStep{&step, kernels::ScalarRef{&skip, DType::i32}});
    CHECK(step == (skip ? 41 : 42));
  }
}

TEST_CASE("any_flag's kernel, emulated: the CPU's OR of the flags", "[optim][emulated]") {
  // Launched as one thread (<<<1, 1>>>), so it runs here as a plain call.
  const std::vector<std::vector<int32_t>> cases = {
      {0}, {1}, {0, 0, 0}, {0, 2, 0}, {-1}, {0, 0, 0, 0, 0, 0, 0, 5}, {0, 0, 0, 0, 0, 0, 0, 0}};
  for (const std::vector<int32_t>& flags : cases) {
    INFO("flags " << ::Catch::Detail::stringify(flags));
    std::vector<Tensor> xs;
    std::vector<std::string> names;
    std::vector<std::pair<std::string, Tensor>> feeds;
    kernels::AnyFlags args{};
    for (size_t i = 0; i < flags.size(); ++i) {
      xs.push_back(i32_scalar(flags[i]));
      names.push_back(numbered("f", i));
      feeds.push_back({names.back(), xs.back()});
      args.x[i] = xs.back().data<int32_t>();
    }
    args.n = static_cast<int>(flags.size());
    int32_t out = -1;
    kernels::any_flag_kernel(args, &out);
    const Tensor cpu =
        run_ops_on({make_op("any_flag", {{"X", names}}, {{"Out", {"any"}}})}, feeds, cpu_device(), ExecEnv{}, {"any"})
            .at("any");
    CHECK(out == cpu.data<int32_t>()[0]);
    bool any = false;
    for (int32_t f : flags) any = any || f != 0;
    CHECK(out == (any ? 1 : 0));
  }
}
