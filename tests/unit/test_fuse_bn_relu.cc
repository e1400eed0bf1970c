// fuse_bn_relu (runtime/passes/fuse_bn_relu.h) and batch_norm's fuse_with_relu
// (runtime/ops/batch_norm.cc): the fused forward and gradient give the bits of
// the pairs they replace, relu's mask recomputed from X included; the pass
// fuses every batch norm + relu of the ResNets and leaves alone what it must;
// and whole training steps, FP32 and AMP, NCHW and NHWC, give the same bits
// with and without it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "models/model.h"
#include "runtime/core/half.h"
#include "runtime/exec/executor.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"
#include "runtime/passes/fuse_add_relu.h"
#include "runtime/passes/fuse_bn_relu.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/gradcheck.h"
#include "tests/unit/train_steps.h"

using namespace mix;
using namespace mix::testing;

namespace {

size_t count_ops(const Program& p, const std::string& type, bool fused) {
  size_t n = 0;
  for (const OpDesc& op : p.ops()) n += op.type == type && op.attr<bool>("fuse_with_relu", false) == fused;
  return n;
}

// X [n, c, h, w] (or [n, h, w, c]) with channels that test the edges of
// relu's recomputed mask; see bn_feeds.
constexpr int64_t kN = 3, kC = 5, kH = 4, kW = 3;

Shape x_shape(bool channels_last) { return channels_last ? Shape{kN, kH, kW, kC} : Shape{kN, kC, kH, kW}; }

// The feeds of a batch_norm on X of `dt`: random X, except that channel 4
// holds a NaN (its statistics and gradients are NaN: both paths must agree
// on them too). Channel 1 has Scale 0 and Bias 1e-8, so its normalised values
// are all 1e-8: FP16 stores them as 0, so relu's gradient must block them
// there, and pass them in FP32 and BF16. Channel 2 has Bias 0 and Scale 0:
// every value is exactly 0 and blocked.
std::vector<std::pair<std::string, Tensor>> bn_feeds(DType dt, bool channels_last, uint64_t seed) {
  Tensor x = uniform_tensor(x_shape(channels_last), seed, -2.f, 2.f);
  const int64_t nan_at = channels_last ? 4 : 4 * kH * kW;  // (n 0, c 4, first pixel)
  x.data<float>()[nan_at] = NAN;
  return {{"x", to_dtype(x, dt)},
          {"scale", Tensor::from_floats({kC}, {1.3f, 0.f, 0.f, -0.7f, 1.f})},
          {"bias", Tensor::from_floats({kC}, {0.2f, 1e-8f, 0.f, 0.1f, -0.3f})},
          {"mean", Tensor::from_floats({kC}, {0.1f, -0.2f, 0.3f, 0.f, 0.5f})},
          {"var", Tensor::from_floats({kC}, {1.f, 2.f, 0.5f, 1.5f, 0.8f})}};
}

OpDesc batch_norm_op(bool channels_last, bool fuse, const std::string& y) {
  std::map<std::string, Attr> attrs{{"data_layout", std::string(channels_last ? "NHWC" : "NCHW")}, {"momentum", 0.9}};
  if (fuse) attrs["fuse_with_relu"] = true;
  return make_op("batch_norm",
                 {{"X", {"x"}}, {"Scale", {"scale"}}, {"Bias", {"bias"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}},
                 {{"Y", {y}},
                  {"MeanOut", {"mean"}},
                  {"VarianceOut", {"var"}},
                  {"SavedMean", {"saved_mean"}},
                  {"SavedVariance", {"saved_var"}}},
                 attrs);
}

const std::vector<std::string> kForwardResults = {"y", "mean", "var", "saved_mean", "saved_var"};

// One forward case: X's dtype and layout, training or evaluation.
struct ForwardCase {
  DType dt;
  bool channels_last;
  ExecEnv env;
  std::string what;                  // for messages
  std::vector<std::string> results;  // what the forward writes (evaluation: Y alone)
};

// f(case) for every dtype, layout and mode.
template <typename F>
void for_each_forward_case(F&& f) {
  for (DType dt : kFloatTypes)
    for (bool last : {false, true})
      for (bool training : {true, false}) {
        ForwardCase c{dt, last, ExecEnv{}, dname(dt) + (last ? " NHWC" : " NCHW") + (training ? " training" : " eval"),
                      training ? kForwardResults : std::vector<std::string>{"y", "mean", "var"}};
        c.env.training = training;
        INFO(c.what);
        f(c);
      }
}

// Not vacuous: relu zeroed some values of Y and passed others.
void expect_some_zeroed(const Tensor& y_tensor) {
  const std::vector<float> y = y_tensor.to_floats();
  CHECK(std::count(y.begin(), y.end(), 0.f) > 0);
  CHECK(std::count_if(y.begin(), y.end(), [](float v) { return v > 0.f; }) > 0);
}

}  // namespace

TEST_CASE("batch_norm with fuse_with_relu gives the bits of batch_norm then relu", "[fuse]") {
  for_each_forward_case([](const ForwardCase& c) {
    const auto feeds = bn_feeds(c.dt, c.channels_last, 1);
    const auto fused = run_ops_on({batch_norm_op(c.channels_last, true, "y")}, feeds, cpu_device(), c.env, c.results);
    const auto pair =
        run_ops_on({batch_norm_op(c.channels_last, false, "t"), make_op("relu", {{"X", {"t"}}}, {{"Out", {"y"}}})},
                   feeds, cpu_device(), c.env, c.results);
    for (const std::string& r : c.results) expect_identical(fused.at(r), pair.at(r), c.what + " " + r);
    expect_some_zeroed(fused.at("y"));
  });
}

TEST_CASE("batch_norm with a residual Z gives the bits of batch_norm then fused_add_relu", "[fuse]") {
  for_each_forward_case([](const ForwardCase& c) {
    auto feeds = bn_feeds(c.dt, c.channels_last, 4);
    // Z with specials (inf, NaN, signed zeros) and values that cancel
    // batch_norm's output or overflow FP16 with it.
    feeds.push_back({"z", with_specials(uniform_tensor(x_shape(c.channels_last), 5, -3.f, 3.f), c.dt)});
    OpDesc fused_op = batch_norm_op(c.channels_last, true, "y");
    fused_op.inputs["Z"] = {"z"};
    const auto fused = run_ops_on({fused_op}, feeds, cpu_device(), c.env, c.results);
    const auto pair = run_ops_on({batch_norm_op(c.channels_last, false, "t"),
                                  make_op("fused_add_relu", {{"X", {"t"}}, {"Y", {"z"}}}, {{"Out", {"y"}}})},
                                 feeds, cpu_device(), c.env, c.results);
    // The batch norm's output as fused_add_relu's Y (a downsampling block's shortcut) too.
    const auto swapped = run_ops_on({batch_norm_op(c.channels_last, false, "t"),
                                     make_op("fused_add_relu", {{"X", {"z"}}, {"Y", {"t"}}}, {{"Out", {"y"}}})},
                                    feeds, cpu_device(), c.env, c.results);
    const auto three = run_ops_on({batch_norm_op(c.channels_last, false, "t"),
                                   make_op("elementwise_add", {{"X", {"t"}}, {"Y", {"z"}}}, {{"Out", {"s"}}}),
                                   make_op("relu", {{"X", {"s"}}}, {{"Out", {"y"}}})},
                                  feeds, cpu_device(), c.env, c.results);
    for (const std::string& r : c.results) {
      expect_identical(fused.at(r), pair.at(r), c.what + " " + r);
      expect_identical(fused.at(r), three.at(r), c.what + " " + r + " (add, relu)");
      expect_identical(fused.at(r), swapped.at(r), c.what + " " + r + " (Z + batch norm)");
    }
    // The CUDA kernels' functor, fn::BnAddRelu<T>, value by value with the
    // statistics the CPU kernel normalised with, gives the CPU kernel's bits.
    if (c.env.training) {
      const std::vector<float> xv = feeds[0].second.to_floats(), zv = feeds.back().second.to_floats(),
                               scale = feeds[1].second.to_floats(), bias = feeds[2].second.to_floats(),
                               mean = fused.at("saved_mean").to_floats(), inv_std = fused.at("saved_var").to_floats(),
                               y = fused.at("y").to_floats();
      int64_t differ = 0;
      cpu::dispatch_floating(c.dt, [&](auto tag) {
        using T = decltype(tag);
        for (size_t i = 0; i < xv.size(); ++i) {
          const auto ch = static_cast<size_t>(c.channels_last ? static_cast<int64_t>(i) % kC
                                                              : static_cast<int64_t>(i) / (kH * kW) % kC);
          const float want =
              to_float(from_float<T>(fn::BnAddRelu<T>{{mean[ch], inv_std[ch] * scale[ch], bias[ch]}}(xv[i], zv[i])));
          differ += !(want == y[i] || (std::isnan(want) && std::isnan(y[i])));
        }
      });
      CHECK(differ == 0);
    }
    expect_some_zeroed(fused.at("y"));
  });
  // A residual needs fuse_with_relu.
  auto feeds = bn_feeds(DType::f32, false, 4);
  feeds.push_back({"z", uniform_tensor(x_shape(false), 5)});
  OpDesc no_relu = batch_norm_op(false, false, "y");
  no_relu.inputs["Z"] = {"z"};
  CHECK_THROWS_WITH(run_ops_on({no_relu}, feeds, cpu_device(), ExecEnv{}, {"y"}),
                    Catch::Contains("needs fuse_with_relu"));
}

TEST_CASE("batch_norm_grad with fuse_with_relu gives the bits of relu_grad then batch_norm_grad", "[fuse]") {
  for (DType dt : kFloatTypes)
    for (bool last : {false, true}) {
      const std::string what = dname(dt) + (last ? " NHWC" : " NCHW");
      INFO(what);
      // The forward's outputs (the fused forward's: the same bits as the pair's, above).
      auto feeds = bn_feeds(dt, last, 2);
      const auto fwd = run_ops_on({batch_norm_op(last, true, "y")}, feeds, cpu_device(), ExecEnv{}, kForwardResults);
      feeds.push_back({"y", fwd.at("y")});
      feeds.push_back({"saved_mean", fwd.at("saved_mean")});
      feeds.push_back({"saved_var", fwd.at("saved_var")});
      feeds.push_back({"dy", random_tensor(x_shape(last), dt, 3, -1.f, 1.f)});
      std::map<std::string, Attr> attrs{{"data_layout", std::string(last ? "NHWC" : "NCHW")}};
      auto grad_op = [&](const std::string& dy, bool fuse) {
        std::map<std::string, std::vector<std::string>> ins{{"X", {"x"}},
                                                            {"Scale", {"scale"}},
                                                            {"SavedMean", {"saved_mean"}},
                                                            {"SavedVariance", {"saved_var"}},
                                                            {"Y@GRAD", {dy}}};
        std::map<std::string, Attr> a = attrs;
        if (fuse) {
          ins["Bias"] = {"bias"};
          ins["Y"] = {"y"};
          a["fuse_with_relu"] = true;
        }
        return make_op("batch_norm_grad", ins,
                       {{"X@GRAD", {"dx"}}, {"Scale@GRAD", {"dscale"}}, {"Bias@GRAD", {"dbias"}}}, a);
      };
      const std::vector<std::string> results{"dx", "dscale", "dbias"};
      const auto fused = run_ops_on({grad_op("dy", true)}, feeds, cpu_device(), ExecEnv{}, results);
      const auto pair = run_ops_on(
          {make_op("relu_grad", {{"Out", {"y"}}, {"Out@GRAD", {"dy"}}}, {{"X@GRAD", {"dt"}}}), grad_op("dt", false)},
          feeds, cpu_device(), ExecEnv{}, {"dx", "dscale", "dbias", "dt"});
      for (const std::string& r : results) expect_identical(fused.at(r), pair.at(r), what + " " + r);

      // The edges were there: channel 1's gradient passed relu in FP32 and
      // BF16 only, channel 2's never, and the mask blocked and passed values
      // of the random channels.
      const std::vector<float> dt_values = pair.at("dt").to_floats();
      auto channel_of = [&](size_t i) {
        return last ? static_cast<int64_t>(i) % kC : static_cast<int64_t>(i) / (kH * kW) % kC;
      };
      std::vector<int> passed(kC, 0), blocked(kC, 0);
      for (size_t i = 0; i < dt_values.size(); ++i) (dt_values[i] == 0.f ? blocked : passed)[channel_of(i)]++;
      CHECK((passed[1] > 0) == (dt != DType::f16));
      CHECK(passed[2] == 0);
      CHECK(passed[0] > 0);
      CHECK(blocked[0] > 0);
      // Channel 4's NaN made its statistics, its Y and so Scale@GRAD NaN
      // (relu's gradient passes a NaN Y's dy, so Bias@GRAD stays a number).
      CHECK(std::isnan(fused.at("dscale").to_floats()[4]));
      CHECK(!std::isnan(fused.at("dbias").to_floats()[4]));
    }
}

namespace {
// fn::BnReluGradFromX<T> (the GPU kernels' mask) against relu_grad of the
// value the forward stored, on values at FP16's and BF16's flush to zero,
// signed zeros, infinities and NaN. The CPU kernel takes the same three
// steps in bulk (normalise, round through T, relu's gradient).
template <typename T>
void check_mask_from_x() {
  const float tiny[] = {1e-8f, -1e-8f, 3e-8f, 0x1p-24f, 0x1p-25f, 0x1p-133f, 0x1p-135f,
                        0.f,   -0.f,   1.f,   -1.f,     INFINITY, -INFINITY, NAN};
  for (float scale : {1.f, 0.5f})
    for (float x : tiny) {
      INFO("x " << x << " scale " << scale);
      const fn::BnNormalize norm{0.f, scale, 0.f};                      // v = x * scale
      const float y = to_float(from_float<T>(fn::ReluFwd{}(norm(x))));  // what the forward stored
      const float expected = fn::ReluBwd{}(y, 0.75f);
      const float got = fn::BnReluGradFromX<T>{norm}(x, 0.75f);
      CHECK(got == expected);
    }
}
}  // namespace

TEST_CASE("relu's mask recomputed from X is relu_grad's mask on the stored Y", "[fuse]") {
  check_mask_from_x<float>();
  check_mask_from_x<half_t>();
  check_mask_from_x<bf16_t>();
  // Not vacuous: FP16 flushes 1e-8 to zero (blocked), FP32 keeps it (passed).
  CHECK(fn::BnReluGradFromX<half_t>{{0.f, 1.f, 0.f}}(1e-8f, 1.f) == 0.f);
  CHECK(fn::BnReluGradFromX<float>{{0.f, 1.f, 0.f}}(1e-8f, 1.f) == 1.f);
}

TEST_CASE("fuse_bn_relu fuses every batch norm + relu of the ResNets", "[fuse]") {
  struct Case {
    const char* name;
    int pairs;
  };
  // ResNet-50: the stem's batch norm and the first two of each of its 16
  // bottlenecks are followed by a relu (the third's relu follows the residual
  // add): 33, forward and backward. resnet-small: the stem and the first of
  // each of its 6 basic blocks: 7.
  for (const Case& c : {Case{"resnet50", 33}, Case{"resnet-small", 7}})
    for (bool use_amp : {false, true})
      for (bool last : {false, true}) {
        INFO(c.name << (use_amp ? " AMP" : " FP32") << (last ? " NHWC" : " NCHW"));
        models::ResNetConfig cfg = models::resnet_preset(c.name);
        cfg.channels_last = last;
        Program plain = training_program(models::build_resnet(cfg, c.name), use_amp);
        Program fused = plain;
        const FusedBnRelu n = fuse_bn_relu(fused, {});
        CHECK(n.forward == c.pairs);
        CHECK(n.backward == c.pairs);
        CHECK(n.forward_add == 0);  // no fused_add_relu without fuse_add_relu
        CHECK(count_ops(fused, "batch_norm", true) == static_cast<size_t>(c.pairs));
        CHECK(count_ops(fused, "batch_norm_grad", true) == static_cast<size_t>(c.pairs));
        CHECK(count_ops(fused, "relu", false) == count_ops(plain, "relu", false) - static_cast<size_t>(c.pairs));
        CHECK(fused.ops().size() == plain.ops().size() - static_cast<size_t>(2 * c.pairs));

        // Each fused forward writes its relu's output; each fused gradient
        // reads that output's gradient and the forward's Bias and Y.
        std::map<std::string, const OpDesc*> forward_by_saved_mean;
        for (const OpDesc& op : fused.ops())
          if (op.type == "batch_norm" && op.attr<bool>("fuse_with_relu", false))
            forward_by_saved_mean[op.out("SavedMean")] = &op;
        for (const OpDesc& op : plain.ops()) {
          if (op.type != "relu_grad") continue;
          const auto relu_at = plain.producer(op.in("Out"));
          REQUIRE(relu_at);
          const auto bn_at = plain.producer(plain.ops()[*relu_at].in("X"));
          if (!bn_at || plain.ops()[*bn_at].type != "batch_norm") continue;
          const OpDesc& bn = plain.ops()[*bn_at];
          REQUIRE(forward_by_saved_mean.count(bn.out("SavedMean")) == 1);
          CHECK(forward_by_saved_mean.at(bn.out("SavedMean"))->out("Y") == op.in("Out"));
          bool found = false;
          for (const OpDesc& g : fused.ops())
            if (g.type == "batch_norm_grad" && g.in("SavedMean") == bn.out("SavedMean")) {
              found = true;
              CHECK(g.attr<bool>("fuse_with_relu", false));
              CHECK(g.in("Y@GRAD") == op.in("Out@GRAD"));
              CHECK(g.in("Y") == op.in("Out"));
              CHECK(g.in("Bias") == bn.in("Bias"));
            }
          CHECK(found);
        }
        // t and dt are gone; the fused gradient reads Y one op later than
        // relu_grad did, where dt (of Y's size) lived before, so the plan
        // may pack differently, by an alignment unit or so (resnet-small
        // FP32: 512 bytes of 7.3 MB), never by a tensor.
        const size_t peak_plain = Executor(plain, {}).plan(8).peak_temporary_bytes;
        const size_t peak_fused = Executor(fused, {}).plan(8).peak_temporary_bytes;
        CHECK(peak_fused <= peak_plain + peak_plain / 1000);
      }
}

TEST_CASE("after fuse_add_relu, fuse_bn_relu folds each block's last batch norm into its add + relu", "[fuse]") {
  struct Case {
    const char* name;
    int forward, backward, forward_add;
  };
  // As mixtrain runs them: fuse_add_relu first. ResNet-50: 33 batch norm +
  // relu pairs, forward and backward, and its 16 blocks' last batch norms
  // (downsampling blocks: the first of the branch's and the shortcut's in
  // program order). resnet-small: the stem's relu gradient is a sum's (its
  // output feeds block 1's branch and shortcut), taken by fuse_add_relu: 7,
  // 6 and 6.
  for (const Case& c : {Case{"resnet50", 33, 33, 16}, Case{"resnet-small", 7, 6, 6}})
    for (bool use_amp : {false, true}) {
      INFO(c.name << (use_amp ? " AMP" : " FP32"));
      models::ResNetConfig cfg = models::resnet_preset(c.name);
      Program plain = training_program(models::build_resnet(cfg, c.name), use_amp);
      fuse_add_relu(plain, {});
      Program fused = plain;
      const FusedBnRelu n = fuse_bn_relu(fused, {});
      CHECK(n.forward == c.forward);
      CHECK(n.backward == c.backward);
      CHECK(n.forward_add == c.forward_add);
      CHECK(count_ops(fused, "fused_add_relu", false) ==
            count_ops(plain, "fused_add_relu", false) - static_cast<size_t>(c.forward_add));
      // Each batch_norm with Z writes a former fused_add_relu's Out from its other operand.
      std::set<std::string> adds;
      for (const OpDesc& op : plain.ops())
        if (op.type == "fused_add_relu") {
          adds.insert(op.in("X") + "," + op.in("Y") + "->" + op.out("Out"));
          adds.insert(op.in("Y") + "," + op.in("X") + "->" + op.out("Out"));
        }
      int with_z = 0;
      for (const OpDesc& op : fused.ops()) {
        if (op.type != "batch_norm" || op.in_or_empty("Z").empty()) continue;
        ++with_z;
        CHECK(op.attr<bool>("fuse_with_relu", false));
        bool found = false;
        for (const OpDesc& bn : plain.ops())
          if (bn.type == "batch_norm" && bn.in("X") == op.in("X"))
            found = found || adds.count(bn.out("Y") + "," + op.in("Z") + "->" + op.out("Y")) == 1;
        CHECK(found);
      }
      CHECK(with_z == c.forward_add);
      const size_t peak_plain = Executor(plain, {}).plan(8).peak_temporary_bytes;
      const size_t peak_fused = Executor(fused, {}).plan(8).peak_temporary_bytes;
      CHECK(peak_fused <= peak_plain + peak_plain / 1000);  // as above
    }
}

TEST_CASE("fuse_bn_relu leaves alone what it cannot fuse", "[fuse]") {
  // One program per case: a batch_norm + relu and relu_grad + batch_norm_grad
  // that would fuse but for one thing.
  auto base = [] {
    Program p;
    for (const char* n : {"x", "x2", "dy"}) p.add_var(var_desc(n, {-1, 4, 3, 3}, DType::f32));
    for (const char* n : {"scale", "bias", "mean", "var"}) p.add_var(var_desc(n, {4}, DType::f32));
    return p;
  };
  auto forward = [](Program& p, const std::string& x, const std::string& tag) {
    OpDesc bn = batch_norm_op(false, false, "t" + tag);
    bn.inputs["X"] = {x};
    bn.outputs["SavedMean"] = {"sm" + tag};
    bn.outputs["SavedVariance"] = {"sv" + tag};
    p.append_op(bn);
    p.append_op(make_op("relu", {{"X", {"t" + tag}}}, {{"Out", {"r" + tag}}}));
  };
  auto backward = [](Program& p, const std::string& x, const std::string& relu_out, const std::string& tag) {
    if (!p.has_var("dt" + tag)) p.add_var(var_desc("dt" + tag, {-1, 4, 3, 3}, DType::f32));  // as autodiff declares it
    p.append_op(make_op("relu_grad", {{"Out", {relu_out}}, {"Out@GRAD", {"dy"}}}, {{"X@GRAD", {"dt" + tag}}}));
    p.append_op(make_op("batch_norm_grad",
                        {{"X", {x}},
                         {"Scale", {"scale"}},
                         {"SavedMean", {"sm" + tag}},
                         {"SavedVariance", {"sv" + tag}},
                         {"Y@GRAD", {"dt" + tag}}},
                        {{"X@GRAD", {"dx" + tag}}, {"Scale@GRAD", {"ds" + tag}}, {"Bias@GRAD", {"db" + tag}}}));
  };
  auto fused = [](Program p, const std::set<std::string>& keep = {}) {
    const FusedBnRelu n = fuse_bn_relu(p, keep);
    return std::make_pair(n.forward, n.backward);
  };
  using Pair = std::pair<int, int>;

  // An op inserted at `at` (counted from the end) that reads x2 and writes s.
  auto insert_computing_op = [](Program& p, int at) {
    p.ops().insert(p.ops().end() - at, make_op("scale", {{"X", {"x2"}}}, {{"Out", {"s"}}}, {{"scale", 2.0}}));
  };
  // A residual block's end: t = batch_norm(x); r = fused_add_relu(t, z).
  auto block_end = [](Program& p, const std::string& z) {
    OpDesc bn = batch_norm_op(false, false, "t");
    bn.outputs["SavedMean"] = {"sm"};
    bn.outputs["SavedVariance"] = {"sv"};
    p.append_op(bn);
    p.append_op(make_op("fused_add_relu", {{"X", {"t"}}, {"Y", {z}}}, {{"Out", {"r"}}}));
  };
  auto fused_add = [](Program p, const std::set<std::string>& keep = {}) { return fuse_bn_relu(p, keep).forward_add; };
  SECTION("a block's end fuses") {
    Program p = base();
    block_end(p, "x2");
    CHECK(fused_add(p) == 1);
  }
  SECTION("a block's end whose batch norm output is kept") {
    Program p = base();
    block_end(p, "x2");
    CHECK(fused_add(p, {"t"}) == 0);
  }
  SECTION("a block's end whose shortcut has another dtype, or broadcasts") {
    // The fused kernel adds Z element for element, of X's shape and dtype.
    for (const VarDesc& z :
         {var_desc("z16", {-1, 4, 3, 3}, DType::f16), var_desc("z_bcast", {-1, 4, 1, 1}, DType::f32)}) {
      INFO("shortcut " << z.name);
      Program p = base();
      p.add_var(z);
      block_end(p, "x2");
      p.ops()[1].inputs["Y"] = {z.name};  // as a program could hold it, never as fuse_add_relu makes it
      CHECK(fused_add(p) == 0);
    }
  }
  SECTION("both operands of a block's add are batch norms: one fuses") {
    // The second batch norm is marked collective, so the first may move past
    // it; the fused op reads the second's output as Z, which the second
    // must then still write.
    Program p = base();
    for (const char* n : {"mean2", "var2"}) p.add_var(var_desc(n, {4}, DType::f32));
    p.add_var(var_desc("t2", {-1, 4, 3, 3}, DType::f32));
    block_end(p, "t2");
    OpDesc bn2 = batch_norm_op(false, false, "t2");
    bn2.inputs["X"] = {"x2"};
    bn2.inputs["Mean"] = bn2.outputs["MeanOut"] = {"mean2"};
    bn2.inputs["Variance"] = bn2.outputs["VarianceOut"] = {"var2"};
    bn2.outputs["SavedMean"] = {"sm2"};
    bn2.outputs["SavedVariance"] = {"sv2"};
    bn2.role = OpRole::collective;
    p.insert_op(1, bn2);
    Program after = p;
    CHECK(fuse_bn_relu(after, {}).forward_add == 1);
    REQUIRE(after.ops().size() == 2);
    CHECK(after.ops()[0].out("Y") == "t2");
    CHECK(after.ops()[1].in("Z") == "t2");
    CHECK(after.ops()[1].out("Y") == "r");

    // And the values are the pair's.
    const std::vector<std::pair<std::string, Tensor>> feeds{{"x", uniform_tensor({2, 4, 3, 3}, 1, -2.f, 2.f)},
                                                            {"x2", uniform_tensor({2, 4, 3, 3}, 2, -2.f, 2.f)},
                                                            {"scale", uniform_tensor({4}, 3, 0.5f, 1.5f)},
                                                            {"bias", uniform_tensor({4}, 4)},
                                                            {"mean", uniform_tensor({4}, 5)},
                                                            {"var", uniform_tensor({4}, 6, 0.5f, 2.f)},
                                                            {"mean2", uniform_tensor({4}, 7)},
                                                            {"var2", uniform_tensor({4}, 8, 0.5f, 2.f)}};
    const std::vector<std::string> results{"r", "mean", "var", "mean2", "var2"};
    auto run = [&](const Program& prog) {
      Scope scope;
      for (const auto& [name, t] : feeds) scope.set(name, t.clone());
      ExecEnv env;
      Executor(prog, {results.begin(), results.end()}).run(scope, env);
      std::map<std::string, Tensor> out;
      for (const std::string& r : results) out[r] = scope.get(r).clone();
      return out;
    };
    const auto want = run(p), got = run(after);
    for (const std::string& r : results) expect_identical(got.at(r), want.at(r), r);
    expect_some_zeroed(got.at("r"));
  }
  SECTION("a computing op between a block's batch norm and its add") {
    Program p = base();
    block_end(p, "x2");
    insert_computing_op(p, 1);
    CHECK(fused_add(p) == 0);
  }
  SECTION("the pairs themselves fuse") {
    Program p = base();
    forward(p, "x", "");
    backward(p, "x", "r", "");
    CHECK(fused(p) == Pair{1, 1});
  }
  SECTION("batch_norm's output has another reader: neither fuses") {
    Program p = base();
    forward(p, "x", "");
    p.append_op(make_op("scale", {{"X", {"t"}}}, {{"Out", {"s"}}}, {{"scale", 2.0}}));
    backward(p, "x", "r", "");
    CHECK(fused(p) == Pair{0, 0});  // the gradient needs its forward fused
  }
  SECTION("the caller keeps batch_norm's output") {
    Program p = base();
    forward(p, "x", "");
    CHECK(fused(p, {"t"}) == Pair{0, 0});
  }
  SECTION("the caller keeps relu's input gradient") {
    Program p = base();
    forward(p, "x", "");
    backward(p, "x", "r", "");
    CHECK(fused(p, {"dt"}) == Pair{1, 0});
  }
  SECTION("relu_grad's relu follows another batch_norm than the gradient's") {
    // Two fused forwards; the first's gradient is given the second's relu output.
    Program p = base();
    forward(p, "x", "");
    forward(p, "x2", "2");
    backward(p, "x", "r2", "");
    CHECK(fused(p) == Pair{2, 0});
  }
  SECTION("relu_grad's relu follows no batch_norm") {
    Program p = base();
    forward(p, "x", "");
    p.append_op(make_op("relu", {{"X", {"x2"}}}, {{"Out", {"r_other"}}}));
    backward(p, "x", "r_other", "");
    CHECK(fused(p) == Pair{1, 0});
  }
  SECTION("a computing op lies between batch_norm and relu") {
    Program p = base();
    forward(p, "x", "");
    insert_computing_op(p, 1);
    backward(p, "x", "r", "");
    CHECK(fused(p) == Pair{0, 0});
  }
  SECTION("a computing op lies between relu_grad and batch_norm_grad") {
    Program p = base();
    forward(p, "x", "");
    backward(p, "x", "r", "");
    insert_computing_op(p, 1);
    CHECK(fused(p) == Pair{1, 0});
  }
  SECTION("batch_norm_grad reads another Scale than the forward") {
    // The mask is recomputed with the forward's Scale.
    Program p = base();
    p.add_var(var_desc("scale2", {4}, DType::f32));
    forward(p, "x", "");
    backward(p, "x", "r", "");
    p.ops()[3].inputs["Scale"] = {"scale2"};
    CHECK(fused(p) == Pair{1, 0});
  }
  SECTION("relu's output gradient has another dtype than X") {
    Program p = base();
    p.add_var(var_desc("dy16", {-1, 4, 3, 3}, DType::f16));
    forward(p, "x", "");
    backward(p, "x", "r", "");
    p.ops()[2].inputs["Out@GRAD"] = {"dy16"};
    CHECK(fused(p) == Pair{1, 0});
  }
}

TEST_CASE("training with fused batch norm + relu gives the bits of training without", "[fuse]") {
  for (bool use_amp : {false, true})
    for (bool last : {false, true}) {
      INFO((use_amp ? "AMP" : "FP32") << (last ? " NHWC" : " NCHW"));
      TrainOptions o{.amp = use_amp, .steps = 3, .batch = 4};
      TrainedModel fused = train_steps(narrow_resnet(last), o);
      o.fuse_bn_relu = false;
      TrainedModel plain = train_steps(narrow_resnet(last), o);
      // The stem's batch norm and each block's first are followed by a relu.
      // The stem's relu feeds block 1's branch and shortcut, so its
      // relu_grad reads a gradient sum and went to fuse_add_relu (which
      // mixtrain runs first): two fused gradients.
      // And each block's last batch norm joins its fused add + relu.
      CHECK(count_ops(fused.model.program, "batch_norm", true) == 3 + 2);
      CHECK(count_ops(fused.model.program, "batch_norm_grad", true) == 2);
      CHECK(count_ops(plain.model.program, "batch_norm", true) == 0);
      for (const TrainedModel* run : {&fused, &plain})
        for (float f : run->found_inf) REQUIRE(f == 0.f);  // every AMP step was applied
      expect_same_training(fused, plain);
    }
}
