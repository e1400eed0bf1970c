// fuse_add_relu (runtime/passes/fuse_add_relu.h) and its two fused ops
// (runtime/ops/fused_add_relu.cc): each fused op gives the bits of the pair it
// replaces; the pass fuses every residual add and gradient sum of the ResNets
// and leaves alone what it must; and whole training steps, FP32 and AMP, give
// the same bits with and without it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "models/model.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/passes/fuse_add_relu.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/gradcheck.h"
#include "tests/unit/train_steps.h"

using namespace mix;
using namespace mix::testing;

namespace {

VarDesc var(const std::string& name, const Shape& s, DType t = DType::f32) { return var_desc(name, s, t); }

}  // namespace

TEST_CASE("fused_add_relu and fused_sum_relu_grad give the bits of the ops they replace", "[fuse]") {
  // Infinities, a NaN, zeros of both signs and sums that overflow FP16 or
  // round to zero: relu must commute with the rounding for every one of them.
  for (DType dt : kFloatTypes)
    for (const Shape& s : {Shape{33, 65}, Shape{1, 3}}) {
      const std::string what = dname(dt) + shape_str(s);
      // Y's specials sit 7 places later than X's, so they meet X's specials
      // (inf + -inf, -0 + 0, ...) and ordinary values alike.
      std::vector<float> yv = with_specials(uniform_tensor(s, 2, -4.f, 4.f), DType::f32).to_floats();
      std::rotate(yv.rbegin(), yv.rbegin() + static_cast<long>(7 % yv.size()), yv.rend());
      const std::vector<std::pair<std::string, Tensor>> xy{{"x", with_specials(uniform_tensor(s, 1, -4.f, 4.f), dt)},
                                                           {"y", floats(s, yv, dt)}};
      const auto fused = run_ops_on({make_op("fused_add_relu", {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"out"}}})}, xy,
                                    cpu_device(), ExecEnv{}, {"out"});
      const auto pair = run_ops_on({make_op("elementwise_add", {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"t"}}}),
                                    make_op("relu", {{"X", {"t"}}}, {{"Out", {"out"}}})},
                                   xy, cpu_device(), ExecEnv{}, {"out"});
      expect_identical(fused.at("out"), pair.at("out"), "fused_add_relu " + what);

      for (int k : {1, 2, 3, 11}) {
        // Gradients up to 3e4 apart: in FP16 some of their sums overflow.
        std::vector<std::pair<std::string, Tensor>> feeds{{"y", with_specials(uniform_tensor(s, 3, -1.f, 1.f), dt)}};
        std::vector<std::string> parts;
        for (int i = 0; i < k; ++i) {
          parts.push_back(numbered("g", static_cast<size_t>(i)));
          feeds.push_back({parts.back(), random_tensor(s, dt, 10 + static_cast<uint64_t>(i), -3e4f, 3e4f)});
        }
        const auto f =
            run_ops_on({make_op("fused_sum_relu_grad", {{"Out", {"y"}}, {"Out@GRAD", parts}}, {{"X@GRAD", {"dx"}}})},
                       feeds, cpu_device(), ExecEnv{}, {"dx"});
        const auto u = run_ops_on({make_op("sum", {{"X", parts}}, {{"Out", {"g"}}}),
                                   make_op("relu_grad", {{"Out", {"y"}}, {"Out@GRAD", {"g"}}}, {{"X@GRAD", {"dx"}}})},
                                  feeds, cpu_device(), ExecEnv{}, {"dx"});
        expect_identical(f.at("dx"), u.at("dx"), "fused_sum_relu_grad of " + std::to_string(k) + " " + what);
        // Not vacuous: the mask zeroed some gradients and passed others.
        const std::vector<float> dx = f.at("dx").to_floats();
        CHECK(std::count(dx.begin(), dx.end(), 0.f) > 0);
        CHECK(std::count(dx.begin(), dx.end(), 0.f) < static_cast<long>(dx.size()));
      }
    }
}

TEST_CASE("fuse_add_relu fuses every residual add and gradient sum of the ResNets", "[fuse]") {
  struct Case {
    const char* name;
    int forward, backward;
  };
  // ResNet-50: 16 blocks, each ending in add + relu; the gradient of each
  // block's input is the sum of its branch's and its shortcut's, followed by
  // the relu_grad of the block before, except the first block, whose input
  // comes from the max-pool: 15 sums. resnet-small (3 stages of 2 blocks, no
  // max-pool): 6 and 6.
  for (const Case& c : {Case{"resnet50", 16, 15}, Case{"resnet-small", 6, 6}})
    for (bool use_amp : {false, true}) {
      INFO(c.name << (use_amp ? " AMP" : " FP32"));
      models::ResNetConfig cfg = models::resnet_preset(c.name);
      Program plain = training_program(models::build_resnet(cfg, c.name), use_amp);
      Program fused = plain;
      const FusedAddRelu n = fuse_add_relu(fused, {});
      CHECK(n.forward == c.forward);
      CHECK(n.backward == c.backward);
      // An add's gradient reads no forward tensor (elementwise_add.cc), so
      // the fused op is the only reader of the add's inputs before backward.
      for (const OpDesc& op : fused.ops())
        if (op.type == "elementwise_add_grad") CHECK(op.all_inputs() == std::vector<std::string>{op.in("Out@GRAD")});
      CHECK(count_ops(fused, "fused_add_relu") == c.forward);
      CHECK(count_ops(fused, "fused_sum_relu_grad") == c.backward);
      CHECK(fused.ops().size() == plain.ops().size() - static_cast<size_t>(n.forward + n.backward));
      // A fused op takes its second op's role: evaluation runs the forward
      // ops alone, and a fused gradient marked forward would run there.
      for (const OpDesc& op : fused.ops())
        if (op.type == "fused_add_relu")
          CHECK(op.role == OpRole::forward);
        else if (op.type == "fused_sum_relu_grad")
          CHECK(op.role == OpRole::backward);

      // Each relu of a same-shape add became one fused op with the add's
      // inputs and the relu's output; each relu_grad of a sum, one with the
      // sum's parts.
      std::set<std::string> fused_outputs;
      for (const OpDesc& op : fused.ops())
        if (op.type == "fused_add_relu")
          fused_outputs.insert(op.in("X") + "+" + op.in("Y") + "->" + op.out("Out"));
        else if (op.type == "fused_sum_relu_grad") {
          std::string key = op.in("Out") + ":";
          for (auto& g : op.ins("Out@GRAD")) key += g + ",";
          fused_outputs.insert(key + "->" + op.out("X@GRAD"));
        }
      int expected = 0;
      for (const OpDesc& op : plain.ops()) {
        if (op.type == "relu") {
          const auto pos = plain.producer(op.in("X"));
          REQUIRE(pos);
          const OpDesc& add = plain.ops()[*pos];
          if (add.type != "elementwise_add" || plain.var(add.in("X")).shape != plain.var(add.in("Y")).shape) continue;
          ++expected;
          CHECK(fused_outputs.count(add.in("X") + "+" + add.in("Y") + "->" + op.out("Out")) == 1);
        } else if (op.type == "relu_grad") {
          const auto pos = plain.producer(op.in("Out@GRAD"));
          if (!pos || plain.ops()[*pos].type != "sum") continue;
          ++expected;
          std::string key = op.in("Out") + ":";
          for (auto& g : plain.ops()[*pos].ins("X")) key += g + ",";
          CHECK(fused_outputs.count(key + "->" + op.out("X@GRAD")) == 1);
        }
      }
      CHECK(expected == c.forward + c.backward);

      // The intermediates are gone, so the planned peak cannot grow.
      const size_t peak_plain = Executor(plain, {}).plan(8).peak_temporary_bytes;
      const size_t peak_fused = Executor(fused, {}).plan(8).peak_temporary_bytes;
      CHECK(peak_fused <= peak_plain);
    }
}

TEST_CASE("fuse_add_relu leaves alone what it cannot fuse", "[fuse]") {
  // One program per case: an add (or sum) and its relu (or relu_grad) that
  // would fuse but for one thing.
  auto base = [] {
    Program p;
    for (const char* n : {"a", "b", "c"}) p.add_var(var(n, {-1, 8}));
    p.add_var(var("bias", {8}));
    return p;
  };
  auto fuses = [](Program p, const std::set<std::string>& keep = {}) {
    const FusedAddRelu n = fuse_add_relu(p, keep);
    return n.forward + n.backward;
  };

  SECTION("the pair itself fuses") {
    Program p = base();
    p.append_op(make_op("elementwise_add", {{"X", {"a"}}, {"Y", {"b"}}}, {{"Out", {"t"}}}));
    p.append_op(make_op("relu", {{"X", {"t"}}}, {{"Out", {"r"}}}));
    p.append_op(make_op("sum", {{"X", {"a", "b", "c"}}}, {{"Out", {"g"}}}));
    p.append_op(make_op("relu_grad", {{"Out", {"r"}}, {"Out@GRAD", {"g"}}}, {{"X@GRAD", {"dx"}}}));
    CHECK(fuses(p) == 2);
  }
  SECTION("the add's output has another reader") {
    Program p = base();
    p.append_op(make_op("elementwise_add", {{"X", {"a"}}, {"Y", {"b"}}}, {{"Out", {"t"}}}));
    p.append_op(make_op("relu", {{"X", {"t"}}}, {{"Out", {"r"}}}));
    p.append_op(make_op("scale", {{"X", {"t"}}}, {{"Out", {"s"}}}, {{"scale", 2.0}}));
    CHECK(fuses(p) == 0);
  }
  SECTION("the caller keeps the sum") {
    Program p = base();
    p.append_op(make_op("elementwise_add", {{"X", {"a"}}, {"Y", {"b"}}}, {{"Out", {"t"}}}));
    p.append_op(make_op("relu", {{"X", {"t"}}}, {{"Out", {"r"}}}));
    CHECK(fuses(p, {"t"}) == 0);
  }
  SECTION("the add's output is persistable") {
    // It lives past the step, for whoever reads it then.
    Program p = base();
    p.append_op(make_op("elementwise_add", {{"X", {"a"}}, {"Y", {"b"}}}, {{"Out", {"t"}}}));
    p.append_op(make_op("relu", {{"X", {"t"}}}, {{"Out", {"r"}}}));
    p.var("t").persistable = true;
    CHECK(fuses(p) == 0);
  }
  SECTION("a collective op between them writes the add's output too") {
    // relu reads that op's value, not the add's: fused, it would read a + b.
    Program p = base();
    p.append_op(make_op("elementwise_add", {{"X", {"a"}}, {"Y", {"b"}}}, {{"Out", {"t"}}}));
    OpDesc second = make_op("scale", {{"X", {"c"}}}, {{"Out", {"t"}}}, {{"scale", 2.0}});
    second.role = OpRole::collective;  // may lie between, and writes nothing the add reads
    p.append_op(second);
    p.append_op(make_op("relu", {{"X", {"t"}}}, {{"Out", {"r"}}}));
    CHECK(fuses(p) == 0);
  }
  SECTION("the add's operands have one shape but two dtypes") {
    // The fused kernel adds X and Y of one dtype.
    Program p = base();
    p.add_var(var("b16", {-1, 8}, DType::f16));
    p.append_op(make_op("elementwise_add", {{"X", {"a"}}, {"Y", {"b"}}}, {{"Out", {"t"}}}));
    p.append_op(make_op("relu", {{"X", {"t"}}}, {{"Out", {"r"}}}));
    p.ops()[0].inputs["Y"] = {"b16"};  // as a program could hold it, never as amp::rewrite makes it
    CHECK(fuses(p) == 0);
  }
  SECTION("the gradient sum's parts have another dtype than its output") {
    // fused_sum_relu_grad stores the parts' dtype, where relu_grad read the sum's.
    Program p = base();
    for (const char* n : {"b16", "c16"}) p.add_var(var(n, {-1, 8}, DType::f16));
    p.append_op(make_op("relu", {{"X", {"a"}}}, {{"Out", {"r"}}}));
    p.append_op(make_op("sum", {{"X", {"b", "c"}}}, {{"Out", {"g"}}}));
    p.append_op(make_op("relu_grad", {{"Out", {"r"}}, {"Out@GRAD", {"g"}}}, {{"X@GRAD", {"dx"}}}));
    p.ops()[1].inputs["X"] = {"b16", "c16"};  // g stays f32, as r is
    CHECK(fuses(p) == 0);
  }
  SECTION("the add broadcasts a bias") {
    Program p = base();
    p.append_op(make_op("elementwise_add", {{"X", {"a"}}, {"Y", {"bias"}}}, {{"Out", {"t"}}}));
    p.append_op(make_op("relu", {{"X", {"t"}}}, {{"Out", {"r"}}}));
    CHECK(fuses(p) == 0);
  }
  SECTION("an op between them rewrites an input of the add") {
    Program p = base();
    p.append_op(make_op("elementwise_add", {{"X", {"a"}}, {"Y", {"b"}}}, {{"Out", {"t"}}}));
    p.append_op(make_op("scale", {{"X", {"a"}}}, {{"Out", {"a"}}}, {{"scale", 2.0}}));
    p.append_op(make_op("relu", {{"X", {"t"}}}, {{"Out", {"r"}}}));
    CHECK(fuses(p) == 0);
  }
  SECTION("the gradient sum has another reader") {
    Program p = base();
    p.append_op(make_op("relu", {{"X", {"a"}}}, {{"Out", {"r"}}}));
    p.append_op(make_op("sum", {{"X", {"b", "c"}}}, {{"Out", {"g"}}}));
    p.append_op(make_op("relu_grad", {{"Out", {"r"}}, {"Out@GRAD", {"g"}}}, {{"X@GRAD", {"dx"}}}));
    p.append_op(make_op("scale", {{"X", {"g"}}}, {{"Out", {"s"}}}, {{"scale", 2.0}}));
    CHECK(fuses(p) == 0);
  }
  SECTION("an op between the sum and relu_grad rewrites a part") {
    Program p = base();
    p.append_op(make_op("relu", {{"X", {"a"}}}, {{"Out", {"r"}}}));
    p.append_op(make_op("sum", {{"X", {"b", "c"}}}, {{"Out", {"g"}}}));
    p.append_op(make_op("scale", {{"X", {"b"}}}, {{"Out", {"b"}}}, {{"scale", 2.0}}));
    p.append_op(make_op("relu_grad", {{"Out", {"r"}}, {"Out@GRAD", {"g"}}}, {{"X@GRAD", {"dx"}}}));
    CHECK(fuses(p) == 0);
    // The same op as a collective one (what may lie between) still writes a
    // part by name; writing something else, it does not stop the fusion.
    p.ops()[2].role = OpRole::collective;
    CHECK(fuses(p) == 0);
    p.ops()[2].outputs["Out"] = {"s"};
    CHECK(fuses(p) == 1);
  }
  SECTION("a computing op lies between them, whatever it writes") {
    // Its outputs could be views of an input (by storage, not by name).
    Program p = base();
    p.append_op(make_op("elementwise_add", {{"X", {"a"}}, {"Y", {"b"}}}, {{"Out", {"t"}}}));
    p.append_op(make_op("scale", {{"X", {"c"}}}, {{"Out", {"s"}}}, {{"scale", 2.0}}));
    p.append_op(make_op("relu", {{"X", {"t"}}}, {{"Out", {"r"}}}));
    CHECK(fuses(p) == 0);
  }
  SECTION("relu_grad reads the sum as its Out") {
    Program p = base();
    p.append_op(make_op("sum", {{"X", {"b", "c"}}}, {{"Out", {"g"}}}));
    p.append_op(make_op("relu_grad", {{"Out", {"g"}}, {"Out@GRAD", {"a"}}}, {{"X@GRAD", {"dx"}}}));
    CHECK(fuses(p) == 0);
  }
  SECTION("the relu output's dtype differs from the gradients'") {
    Program p = base();
    p.add_var(var("r16", {-1, 8}, DType::f16));
    p.append_op(make_op("sum", {{"X", {"b", "c"}}}, {{"Out", {"g"}}}));
    p.append_op(make_op("relu_grad", {{"Out", {"r16"}}, {"Out@GRAD", {"g"}}}, {{"X@GRAD", {"dx"}}}));
    CHECK(fuses(p) == 0);
  }
  SECTION("a sum read by something other than relu_grad") {
    Program p = base();
    p.append_op(make_op("sum", {{"X", {"b", "c"}}}, {{"Out", {"g"}}}));
    p.append_op(make_op("tanh_grad", {{"Out", {"a"}}, {"Out@GRAD", {"g"}}}, {{"X@GRAD", {"dx"}}}));
    CHECK(fuses(p) == 0);
  }
}

TEST_CASE("training with fused add + relu gives the bits of training without", "[fuse]") {
  for (bool use_amp : {false, true}) {
    INFO((use_amp ? "AMP" : "FP32"));
    // fuse_bn_relu off: it would fold these fused_add_relu ops into batch norms.
    TrainOptions o{.amp = use_amp, .fuse_bn_relu = false, .steps = 3, .batch = 4};
    TrainedModel fused = train_steps(narrow_resnet(), o);
    o.fuse_add_relu = false;
    TrainedModel plain = train_steps(narrow_resnet(), o);
    // Both blocks end in add + relu, and the gradients of both blocks'
    // inputs are sums followed by relu_grad (the stem's relu, block 1's).
    CHECK(count_ops(fused.model.program, "fused_add_relu") == 2);
    CHECK(count_ops(fused.model.program, "fused_sum_relu_grad") == 2);
    CHECK(count_ops(plain.model.program, "fused_add_relu") == 0);
    for (const TrainedModel* run : {&fused, &plain})
      for (float f : run->found_inf) REQUIRE(f == 0.f);  // every AMP step was applied
    expect_same_training(fused, plain);
  }
}
