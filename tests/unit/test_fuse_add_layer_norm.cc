// fuse_add_layer_norm (runtime/passes/fuse_add_layer_norm.h) and its op
// fused_add_layer_norm (runtime/ops/fused_add_layer_norm.cc): the op gives the
// bits of elementwise_add then layer_norm (tests/unit/add_layer_norm_check.h);
// the pass fuses every residual add of a GPT with the layer norm after it,
// the sum staying an output, and leaves alone what it must; training with and
// without it gives the same bits in FP32, AMP and BF16.
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "models/model.h"
#include "runtime/ir/op_registry.h"
#include "runtime/passes/fuse_add_layer_norm.h"
#include "tests/unit/add_layer_norm_check.h"
#include "tests/unit/gradcheck.h"
#include "tests/unit/train_steps.h"

using namespace mix;
using namespace mix::testing;
using Catch::Matchers::Contains;

namespace {

int forward_ops(const Program& p, const std::string& type) {
  int n = 0;
  for (const OpDesc& op : p.ops()) n += op.type == type && op.role == OpRole::forward;
  return n;
}

// a + b (b of a's shape), then layer_norm of the sum; `between` ops go
// between the two; every variable declared.
Program add_then_norm(const std::vector<OpDesc>& between = {}) {
  Program p;
  for (const char* n : {"a", "b", "c"}) p.add_var(var_desc(n, {3, 4}, DType::f32));
  VarDesc scale = var_desc("scale", {4}, DType::f32);
  scale.persistable = true;
  p.add_var(scale);
  p.append_op(make_op("elementwise_add", {{"X", {"a"}}, {"Y", {"b"}}}, {{"Out", {"s"}}}, {{"axis", int64_t{-1}}}));
  for (const OpDesc& op : between) p.append_op(op);
  p.append_op(make_op("layer_norm", {{"X", {"s"}}, {"Scale", {"scale"}}},
                      {{"Y", {"n"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}}, {{"begin_norm_axis", int64_t{1}}}));
  return p;
}

}  // namespace

TEST_CASE("fused_add_layer_norm gives the bits of elementwise_add then layer_norm", "[fuse_add_layer_norm][ops]") {
  for (DType dt : kFloatTypes)
    for (const Shape& s : {Shape{7, 10}, Shape{2, 3, 33}}) check_fused_add_layer_norm(cpu_device(), dt, dt, dt, s, s);
  // The AMP residual stream: FP32 plus a block's FP16/BF16 output, normalised into FP16/BF16.
  for (DType narrow : {DType::f16, DType::bf16}) {
    check_fused_add_layer_norm(cpu_device(), DType::f32, narrow, narrow, {4, 5, 24}, {4, 5, 24});
    check_fused_add_layer_norm(cpu_device(), DType::f32, narrow, DType::f32, {6, 20}, {6, 20});
  }
  // The position embedding: Y of X's trailing dims, added to each sequence.
  check_fused_add_layer_norm(cpu_device(), DType::f32, DType::f32, DType::f16, {3, 5, 24}, {5, 24});
  check_fused_add_layer_norm(cpu_device(), DType::f32, DType::f32, DType::f32, {3, 5, 24}, {24});
}

TEST_CASE("fused_add_layer_norm: bad operands name the problem", "[fuse_add_layer_norm][ops][errors]") {
  const auto build = [](const Shape& x, DType xt, const Shape& y, DType yt, const Shape& scale) {
    Program p;
    p.add_var(var_desc("x", x, xt));
    p.add_var(var_desc("y", y, yt));
    p.add_var(var_desc("scale", scale, DType::f32));
    p.append_op(make_op("fused_add_layer_norm", {{"X", {"x"}}, {"Y", {"y"}}, {"Scale", {"scale"}}},
                        {{"Out", {"s"}}, {"Norm", {"n"}}, {"Mean", {"m"}}, {"Variance", {"v"}}},
                        {{"begin_norm_axis", int64_t{-1}}}));
    return p;
  };
  const Program ok = build({-1, 5, 8}, DType::f32, {5, 8}, DType::f32, {8});
  CHECK(ok.var("s").shape == Shape{-1, 5, 8});
  CHECK(ok.var("m").shape == Shape{-1});
  CHECK_THROWS_WITH(build({2, 5, 8}, DType::f32, {2, 5}, DType::f32, {8}),
                    Contains("fused_add_layer_norm: Y [2, 5] must have X's shape [2, 5, 8] or its trailing dims"));
  CHECK_THROWS_WITH(build({2, 5, 8}, DType::f32, {5, 8}, DType::f16, {8}), Contains("must have X's shape"));
  CHECK_THROWS_WITH(build({2, 5, 8}, DType::f32, {2, 5, 8}, DType::f32, {5}), Contains("Scale scale must be f32[8]"));
}

TEST_CASE("fuse_add_layer_norm fuses each residual add of a GPT with the layer norm after it",
          "[fuse_add_layer_norm]") {
  for (amp::Precision precision : {amp::Precision::fp32, amp::Precision::amp, amp::Precision::bf16}) {
    INFO(amp::to_string(precision));
    models::Model m = tiny_gpt_model(true);
    launch::TrainProgramOptions o = program_options(false);
    o.precision = precision;
    launch::TrainProgram t = launch::build_train_program(m.program, m.loss, o);
    const int adds = forward_ops(m.program, "elementwise_add"), norms = forward_ops(m.program, "layer_norm");
    REQUIRE(norms == 5);  // two blocks' ln_1 and ln_2, and ln_f
    // The embeddings' add before ln_1 of block 0, each block's attention
    // residual before its ln_2 and MLP residual before the next ln_1 or ln_f.
    CHECK(fuse_add_layer_norm(m.program) == 5);
    CHECK(forward_ops(m.program, "layer_norm") == 0);
    CHECK(forward_ops(m.program, "elementwise_add") == adds - 5);
    for (const OpDesc& op : m.program.ops()) {
      if (op.type != "fused_add_layer_norm") continue;
      INFO(op.out("Out"));
      // The sum stays: the next residual add or backward's layer_norm_grad reads it.
      CHECK(!m.program.readers(op.out("Out")).empty());
      CHECK(m.program.var(op.out("Norm")).dtype == (amp::is_mixed(precision) ? amp::low_dtype(precision) : DType::f32));
    }
    CHECK(fuse_add_layer_norm(m.program) == 0);
  }
}

TEST_CASE("fuse_add_layer_norm leaves alone what it must", "[fuse_add_layer_norm]") {
  Program plain = add_then_norm();
  CHECK(fuse_add_layer_norm(plain) == 1);
  REQUIRE(plain.ops().size() == 1);
  CHECK(plain.ops()[0].type == "fused_add_layer_norm");
  CHECK(plain.ops()[0].out("Out") == "s");
  CHECK(plain.ops()[0].out("Norm") == "n");
  // Something reads the sum before the layer norm does: it still may (the sum
  // is an output), so the pair fuses.
  Program read_between = add_then_norm({doubling_op("s", "c")});
  CHECK(fuse_add_layer_norm(read_between) == 1);
  // The layer norm's Scale written between the two: the fused op, where the add ran, would read it too early.
  Program scale_written = add_then_norm({doubling_op("scale", "scale")});
  CHECK(fuse_add_layer_norm(scale_written) == 0);
  // The layer norm's output named between the two.
  Program out_named = add_then_norm({doubling_op("a", "n")});
  CHECK(fuse_add_layer_norm(out_named) == 0);
  // A layer norm of something else.
  Program other_input = add_then_norm();
  other_input.ops()[1].inputs["X"] = {"a"};
  CHECK(fuse_add_layer_norm(other_input) == 0);
  // A layer norm whose statistics nobody keeps (no Mean, Variance) is not the training program's.
  Program no_stats = add_then_norm();
  no_stats.ops()[1].outputs.erase("Mean");
  no_stats.ops()[1].outputs.erase("Variance");
  CHECK(fuse_add_layer_norm(no_stats) == 0);
}

TEST_CASE("training with residual adds and layer norms fused gives the bits of training without",
          "[fuse_add_layer_norm]") {
  struct Case {
    bool tied, amp;
    DType low;
    double dropout;
  };
  for (const Case& c : {Case{false, false, DType::f16, 0.0}, Case{true, true, DType::f16, 0.0},
                        Case{true, true, DType::bf16, 0.0}, Case{false, true, DType::f16, 0.1}}) {
    INFO((c.tied ? "tied" : "untied") << (c.amp ? ", AMP " + dname(c.low) : ", FP32") << ", dropout " << c.dropout);
    TrainOptions o{.amp = c.amp, .low = c.low, .steps = 3, .batch = 2};
    TrainedModel fused = train_steps(tiny_gpt_model(c.tied, c.dropout), o);
    o.fuse_add_layer_norm = false;
    TrainedModel apart = train_steps(tiny_gpt_model(c.tied, c.dropout), o);
    CHECK(count_ops(fused.model.program, "fused_add_layer_norm") > 0);
    CHECK(count_ops(apart.model.program, "fused_add_layer_norm") == 0);
    expect_same_training(fused, apart);
  }
}
