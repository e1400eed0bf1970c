// fold_grad_sums (runtime/passes/fold_grad_sums.h) and input Accumulate of
// layer_norm_grad and lookup_table_grad (runtime/ops/accumulate_input.h):
// each op given a gradient's other part writes the bits of the op followed by
// `sum` (tests/unit/grad_sum_check.h); the pass folds every residual-stream
// sum of the Transformer and, with tied embeddings, the token embedding's
// sum and its FP16/BF16 cast, and leaves alone what it must; training with
// and without it gives the same bits in FP32, AMP and BF16.
#include <catch2/catch.hpp>

#include <functional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "models/model.h"
#include "runtime/ir/op_registry.h"
#include "runtime/passes/fold_grad_sums.h"
#include "tests/unit/grad_sum_check.h"
#include "tests/unit/train_steps.h"

using namespace mix;
using namespace mix::testing;
using Catch::Matchers::Contains;

namespace {

// A layer_norm_grad writing part `b` of `g = sum(a, b)`, every variable
// declared (gradient ops declare none themselves); `extra` ops go between the
// two, and `parts` are the sum's inputs.
Program ln_grad_then_sum(const std::vector<OpDesc>& extra = {}, const std::vector<std::string>& parts = {"a", "b"}) {
  Program p;
  for (const auto& [name, shape] : std::vector<std::pair<std::string, Shape>>{{"x", {4, 6}},
                                                                              {"scale", {6}},
                                                                              {"mean", {4}},
                                                                              {"var", {4}},
                                                                              {"dy", {4, 6}},
                                                                              {"a", {4, 6}},
                                                                              {"a2", {4, 6}},
                                                                              {"b", {4, 6}},
                                                                              {"c", {4, 6}}}) {
    VarDesc v = var_desc(name, shape, DType::f32);
    v.persistable = name != "b" && name != "c";
    p.add_var(v);
  }
  p.append_op(
      make_op("layer_norm_grad",
              {{"X", {"x"}}, {"Scale", {"scale"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}, {"Y@GRAD", {"dy"}}},
              {{"X@GRAD", {"b"}}}, {{"begin_norm_axis", int64_t{1}}}));
  for (const OpDesc& op : extra) p.append_op(op);
  p.append_op(make_op("sum", {{"X", parts}}, {{"Out", {"g"}}}));
  return p;
}

}  // namespace

TEST_CASE("layer_norm_grad and lookup_table_grad with Accumulate: the bits of the op followed by sum",
          "[fold_grad_sums][ops]") {
  for (DType dt : kFloatTypes)
    for (const Shape& s : {Shape{7, 10}, Shape{3, 5, 33}}) check_layer_norm_grad_accumulate(cpu_device(), dt, dt, s);
  for (DType narrow : {DType::f16, DType::bf16})
    check_layer_norm_grad_accumulate(cpu_device(), DType::f32, narrow, {6, 20});
  check_lookup_table_grad_accumulate(cpu_device(), DType::f32, DType::f32);
  for (DType narrow : {DType::f16, DType::bf16}) {
    check_lookup_table_grad_accumulate(cpu_device(), DType::f32, narrow);  // a tied output layer's FP16 part
    check_lookup_table_grad_accumulate(cpu_device(), narrow, narrow);
  }
}

TEST_CASE("Accumulate of the wrong shape or dtype names the problem", "[fold_grad_sums][ops][errors]") {
  const Tensor x = random_tensor({4, 6}, DType::f32, 1);
  const Tensor stat = random_tensor({4}, DType::f32, 2, 0.5f, 1.f);
  const auto ln_grad = [&](const Tensor& other) {
    return run_ops_on(
        {make_op("layer_norm_grad",
                 {{"X", {"x"}}, {"Mean", {"m"}}, {"Variance", {"v"}}, {"Y@GRAD", {"dy"}}, {"Accumulate", {"o"}}},
                 {{"X@GRAD", {"dx"}}}, {{"begin_norm_axis", int64_t{1}}})},
        {{"x", x}, {"m", stat}, {"v", stat}, {"dy", x}, {"o", other}}, cpu_device(), ExecEnv{}, {"dx"});
  };
  CHECK_THROWS_WITH(ln_grad(random_tensor({4, 5}, DType::f32, 3)),
                    Contains("layer_norm_grad: Accumulate f32[4, 5] must be f32[4, 6], the other part of X@GRAD"));
  // layer_norm_grad takes its other part in X's dtype only.
  CHECK_THROWS_WITH(ln_grad(random_tensor({4, 6}, DType::f16, 3)), Contains("Accumulate f16[4, 6] must be f32[4, 6],"));

  const auto lookup_grad = [&](DType w_dtype, const Tensor& other) {
    return run_ops_on(
        {make_op("lookup_table_grad", {{"W", {"w"}}, {"Ids", {"ids"}}, {"Out@GRAD", {"dout"}}, {"Accumulate", {"o"}}},
                 {{"W@GRAD", {"dw"}}})},
        {{"w", random_tensor({5, 3}, w_dtype, 4)},
         {"ids", i64_tensor({2}, {1, 4})},
         {"dout", random_tensor({2, 3}, w_dtype, 5)},
         {"o", other}},
        cpu_device(), ExecEnv{}, {"dw"});
  };
  CHECK_NOTHROW(lookup_grad(DType::f32, random_tensor({5, 3}, DType::f16, 6)));
  CHECK_THROWS_WITH(lookup_grad(DType::f16, random_tensor({5, 3}, DType::f32, 6)),
                    Contains("lookup_table_grad: Accumulate f32[5, 3] must be f16[5, 3] (or f16/bf16 for f32)"));
  CHECK_THROWS_WITH(lookup_grad(DType::f32, random_tensor({3, 5}, DType::f32, 6)),
                    Contains("Accumulate f32[3, 5] must be f32[5, 3]"));
}

TEST_CASE("fold_grad_sums folds the Transformer's residual-stream sums, and a tied embedding's sum and cast",
          "[fold_grad_sums]") {
  struct Case {
    bool tied;
    amp::Precision precision;
    int sums, casts;
  };
  // Two blocks: the residual stream feeds a layer norm and skips the block
  // at each of its 2 x 2 points but the last (ln_f alone reads the last
  // block's output), so 4 sums; tied, also the token embedding's two parts,
  // whose output-layer part is FP16/BF16 under the mixed precisions.
  for (const Case& c : {Case{false, amp::Precision::fp32, 4, 0}, Case{true, amp::Precision::fp32, 5, 0},
                        Case{false, amp::Precision::amp, 4, 0}, Case{true, amp::Precision::amp, 5, 1},
                        Case{true, amp::Precision::bf16, 5, 1}}) {
    INFO((c.tied ? "tied, " : "untied, ") << amp::to_string(c.precision));
    models::Model m = tiny_gpt_model(c.tied);
    launch::TrainProgramOptions o = program_options(false);
    o.precision = c.precision;
    launch::TrainProgram t = launch::build_train_program(m.program, m.loss, o);
    const int sums = count_ops(m.program, "sum"), casts = count_ops(m.program, "cast");
    const FoldedGradSums f = fold_grad_sums(m.program, t.read_back);
    CHECK(f.sums == c.sums);
    CHECK(f.casts == c.casts);
    CHECK(count_ops(m.program, "sum") == sums - c.sums);
    CHECK(count_ops(m.program, "cast") == casts - c.casts);
    int accumulating = 0;
    for (const OpDesc& op : m.program.ops()) {
      const std::string other = op.in_or_empty("Accumulate");
      if (other.empty()) continue;
      ++accumulating;
      INFO(op.type << " reads " << other);
      if (op.type == "lookup_table_grad") {
        CHECK(c.tied);
        CHECK(op.out("W@GRAD") == "transformer.wte.weight@GRAD");
        CHECK(m.program.var(other).dtype == (c.casts ? amp::low_dtype(c.precision) : DType::f32));
      } else {
        CHECK(op.type == "layer_norm_grad");
        CHECK(m.program.var(other).dtype == DType::f32);  // the FP32 residual stream's gradient
      }
    }
    CHECK(accumulating == c.sums);
    CHECK(fold_grad_sums(m.program, t.read_back).sums == 0);  // nothing left to fold
  }
}

TEST_CASE("fold_grad_sums leaves alone what it must", "[fold_grad_sums]") {
  Program plain = ln_grad_then_sum();
  CHECK(fold_grad_sums(plain, {}).sums == 1);
  REQUIRE(plain.ops().size() == 1);
  CHECK(plain.ops()[0].in("Accumulate") == "a");
  CHECK(plain.ops()[0].out("X@GRAD") == "g");

  Program kept = ln_grad_then_sum();
  CHECK(fold_grad_sums(kept, {"b"}).sums == 0);  // the caller reads the part
  Program read_twice = ln_grad_then_sum({doubling_op("b", "c")});
  CHECK(fold_grad_sums(read_twice, {}).sums == 0);
  Program three_parts = ln_grad_then_sum({}, {"a", "b", "a2"});
  CHECK(fold_grad_sums(three_parts, {}).sums == 0);
  // The other part written in place between the op and the sum: the op would read it too early.
  Program other_written = ln_grad_then_sum({doubling_op("a", "a")});
  CHECK(fold_grad_sums(other_written, {}).sums == 0);
  // The other part written after the op: the op that writes last is the scale, which cannot add.
  Program other_later = ln_grad_then_sum({doubling_op("x", "a")});
  CHECK(fold_grad_sums(other_later, {}).sums == 0);
  // The sum's output touched between the two.
  Program out_touched = ln_grad_then_sum({doubling_op("x", "g")});
  CHECK(fold_grad_sums(out_touched, {}).sums == 0);
  // A sum of parts no accumulating op writes.
  Program no_op;
  for (const char* n : {"x", "a", "b"}) no_op.add_var(var_desc(n, {2}, DType::f32));
  no_op.append_op(doubling_op("x", "b"));
  no_op.append_op(make_op("sum", {{"X", {"a", "b"}}}, {{"Out", {"g"}}}));
  CHECK(fold_grad_sums(no_op, {}).sums == 0);

  // The other part an FP16 gradient widened by a cast (a tied output
  // layer's): the cast folds too, unless something else reads its output.
  const auto cast_program = [](bool other_reader) {
    Program p;
    for (const auto& [name, shape, dtype] :
         std::vector<std::tuple<std::string, Shape, DType>>{{"w", {5, 3}, DType::f32},
                                                            {"ids", {2}, DType::i64},
                                                            {"dout", {2, 3}, DType::f32},
                                                            {"h", {5, 3}, DType::f16}}) {
      VarDesc v = var_desc(name, shape, dtype);
      v.persistable = true;
      p.add_var(v);
    }
    for (const char* n : {"a", "b", "c"}) p.add_var(var_desc(n, {5, 3}, DType::f32));
    p.append_op(make_op("cast", {{"X", {"h"}}}, {{"Out", {"a"}}}, {{"out_dtype", std::string("f32")}}));
    if (other_reader) p.append_op(doubling_op("a", "c"));
    p.append_op(
        make_op("lookup_table_grad", {{"W", {"w"}}, {"Ids", {"ids"}}, {"Out@GRAD", {"dout"}}}, {{"W@GRAD", {"b"}}}));
    p.append_op(make_op("sum", {{"X", {"a", "b"}}}, {{"Out", {"g"}}}));
    return p;
  };
  Program cast_read = cast_program(true);
  FoldedGradSums f = fold_grad_sums(cast_read, {});
  CHECK(f.sums == 1);
  CHECK(f.casts == 0);
  CHECK(count_ops(cast_read, "cast") == 1);
  CHECK(cast_read.ops().back().in("Accumulate") == "a");
  Program cast_alone = cast_program(false);
  f = fold_grad_sums(cast_alone, {});
  CHECK(f.sums == 1);
  CHECK(f.casts == 1);
  REQUIRE(cast_alone.ops().size() == 1);
  CHECK(cast_alone.ops()[0].in("Accumulate") == "h");
  CHECK(cast_alone.ops()[0].out("W@GRAD") == "g");
}

TEST_CASE("training with the gradient sums folded gives the bits of training without", "[fold_grad_sums]") {
  struct Case {
    bool tied, amp;
    DType low;
    double dropout;
  };
  for (const Case& c :
       {Case{false, false, DType::f16, 0.0}, Case{true, false, DType::f16, 0.0}, Case{true, true, DType::f16, 0.0},
        Case{true, true, DType::bf16, 0.0}, Case{true, true, DType::f16, 0.1}}) {
    INFO((c.tied ? "tied" : "untied") << (c.amp ? ", AMP " + dname(c.low) : ", FP32") << ", dropout " << c.dropout);
    TrainOptions o{.amp = c.amp, .low = c.low, .steps = 3, .batch = 2};
    TrainedModel folded = train_steps(tiny_gpt_model(c.tied, c.dropout), o);
    o.fold_grad_sums = false;
    TrainedModel apart = train_steps(tiny_gpt_model(c.tied, c.dropout), o);
    CHECK(count_ops(folded.model.program, "sum") < count_ops(apart.model.program, "sum"));
    expect_same_training(folded, apart);
  }
}
