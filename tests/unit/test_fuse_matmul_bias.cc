// fuse_matmul_bias (runtime/passes/fuse_matmul_bias.h) and its op
// fused_matmul_bias (runtime/ops/fused_matmul_bias.cc): the op is the FP32
// product plus the bias, rounded once (the bits of matmul + elementwise_add in
// FP32; in FP16 and BF16 one rounding fewer); the pass fuses every linear
// layer of the Transformer and leaves alone what it must; FP32 training gives
// the same bits with and without it, and AMP training the same losses within
// FP16's rounding.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "models/model.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/passes/fuse_matmul_bias.h"
#include "tests/unit/amp_test_programs.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/gradcheck.h"
#include "tests/unit/train_steps.h"

using namespace mix;
using namespace mix::testing;
using Catch::Matchers::Contains;

namespace {

// Runs `ops` on the CPU from `feeds` and returns `result`.
Tensor run_cpu(const std::vector<OpDesc>& ops, const std::vector<std::pair<std::string, Tensor>>& feeds,
               const std::string& result) {
  Program p;
  for (const auto& [name, t] : feeds) {
    VarDesc v = var_desc(name, t.shape(), t.dtype());
    v.persistable = true;
    p.add_var(v);
  }
  for (const OpDesc& op : ops) p.append_op(op);
  Scope scope;
  for (const auto& [name, t] : feeds) scope.set(name, t.clone());
  ExecEnv env;
  Executor(p, {result}).run(scope, env);
  return scope.get(result);
}

models::Model tiny_gpt() {
  return models::build_transformer(
      models::TransformerConfig{.layers = 2, .d_model = 16, .heads = 2, .context = 8, .vocab = 40});
}

}  // namespace

TEST_CASE("fused_matmul_bias is the FP32 product plus the bias, rounded once", "[fuse][ops]") {
  // X [2, 5, 7] by a shared weight, transposed or not, alpha 1 or 0.5.
  for (DType dt : kFloatTypes) {
    for (bool ty : {false, true}) {
      for (double alpha : {1.0, 0.5}) {
        INFO(dname(dt) << (ty ? ", transpose_Y" : "") << ", alpha " << alpha);
        const Tensor x = to_dtype(rounded_through(uniform_tensor({2, 5, 7}, 11), dt), dt);
        const Tensor y = to_dtype(rounded_through(uniform_tensor(ty ? Shape{6, 7} : Shape{7, 6}, 12), dt), dt);
        const Tensor b = to_dtype(rounded_through(uniform_tensor({6}, 13, -4.f, 4.f), dt), dt);
        const std::map<std::string, Attr> attrs = {{"transpose_Y", ty}, {"alpha", alpha}};
        const Tensor fused = run_cpu(
            {make_op("fused_matmul_bias", {{"X", {"x"}}, {"Y", {"y"}}, {"Bias", {"b"}}}, {{"Out", {"out"}}}, attrs)},
            {{"x", x}, {"y", y}, {"b", b}}, "out");
        REQUIRE(fused.shape() == Shape{2, 5, 6});
        REQUIRE(fused.dtype() == dt);
        // The reference: the same FP32 product (matmul on FP32 copies of the
        // inputs), plus the bias in FP32, rounded once to dt.
        const Tensor product = run_cpu({make_op("matmul", {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"out"}}}, attrs)},
                                       {{"x", to_dtype(x, DType::f32)}, {"y", to_dtype(y, DType::f32)}}, "out");
        std::vector<float> want = product.to_floats();
        const std::vector<float> bias = b.to_floats();
        for (size_t i = 0; i < want.size(); ++i) want[i] += bias[i % bias.size()];
        CHECK(fused.to_floats() == to_dtype(Tensor::from_floats({2, 5, 6}, want), dt).to_floats());
        // matmul + elementwise_add in dt: the same bits in FP32; in FP16 and
        // BF16 a rounding more (the product's), never nearer the FP32 value.
        const Tensor unfused = run_cpu(
            {make_op("matmul", {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"t"}}}, attrs),
             make_op("elementwise_add", {{"X", {"t"}}, {"Y", {"b"}}}, {{"Out", {"out"}}}, {{"axis", int64_t{-1}}})},
            {{"x", x}, {"y", y}, {"b", b}}, "out");
        const std::vector<float> f = fused.to_floats(), u = unfused.to_floats();
        if (dt == DType::f32) {
          CHECK(f == u);
        } else {
          bool some_differ = false;
          for (size_t i = 0; i < f.size(); ++i) {
            CHECK(std::fabs(f[i] - want[i]) <= std::fabs(u[i] - want[i]));
            some_differ = some_differ || f[i] != u[i];
          }
          CHECK(some_differ);  // the test tells the two apart
        }
      }
    }
  }
}

TEST_CASE("fused_matmul_bias: bad inputs name the problem", "[fuse][ops][errors]") {
  auto build = [](const Shape& x, const Shape& y, const Shape& b, DType bt = DType::f32, bool tx = false) {
    Program p;
    p.add_var(var_desc("x", x, DType::f32));
    p.add_var(var_desc("y", y, DType::f32));
    p.add_var(var_desc("b", b, bt));
    p.append_op(make_op("fused_matmul_bias", {{"X", {"x"}}, {"Y", {"y"}}, {"Bias", {"b"}}}, {{"Out", {"o"}}},
                        {{"transpose_X", tx}}));
    return p;
  };
  CHECK(build({-1, 4, 3}, {3, 5}, {5}).var("o").shape == Shape{-1, 4, 5});
  CHECK_THROWS_WITH(build({2, 4, 3}, {2, 3, 5}, {5}), Contains("2-D weight"));
  CHECK_THROWS_WITH(build({2, 4, 3}, {3, 5}, {4}), Contains("Bias must be [N] = [5]"));
  CHECK_THROWS_WITH(build({2, 4, 3}, {3, 5}, {5}, DType::f16), Contains("one float dtype"));
  CHECK_THROWS_WITH(build({2, 3, 4}, {3, 5}, {5}, DType::f32, true), Contains("cannot be transposed"));
}

TEST_CASE("fuse_matmul_bias fuses every linear layer of the Transformer, and nothing else", "[fuse]") {
  for (bool use_amp : {false, true}) {
    INFO((use_amp ? "AMP" : "FP32"));
    models::Model m = tiny_gpt();
    launch::TrainProgramOptions o = program_options(use_amp);
    o.passes.fuse_param_casts = true;  // under AMP the biases' casts must leave the pairs first
    launch::TrainProgram t = launch::build_train_program(m.program, m.loss, o);
    const int matmuls = count_ops(m.program, "matmul"), adds = count_ops(m.program, "elementwise_add");
    const int fused = fuse_matmul_bias(m.program, t.read_back);
    // Four linear layers a block (c_attn, c_proj, c_fc, mlp.c_proj), 2 blocks;
    // the tied output layer has no bias and stays a matmul.
    CHECK(fused == 8);
    CHECK(count_ops(m.program, "fused_matmul_bias") == 8);
    CHECK(count_ops(m.program, "matmul") == matmuls - 8);
    CHECK(count_ops(m.program, "matmul") >= 1);
    CHECK(count_ops(m.program, "elementwise_add") == adds - 8);  // the residual adds stay
    for (const OpDesc& op : m.program.ops())
      if (op.type == "fused_matmul_bias") {
        INFO(op.out("Out"));
        CHECK(m.program.var(op.in("Bias")).shape.size() == 1);
        CHECK(op.attr<bool>("transpose_Y", false));
      }
    CHECK(fuse_matmul_bias(m.program, t.read_back) == 0);  // nothing left to fuse
  }
}

TEST_CASE("fuse_matmul_bias fuses each layer of the MLP (mul + bias)", "[fuse]") {
  for (bool use_amp : {false, true}) {
    INFO((use_amp ? "AMP" : "FP32"));
    models::Model m = small_mlp();
    launch::TrainProgramOptions o = program_options(use_amp);
    o.passes.fuse_param_casts = true;
    launch::TrainProgram t = launch::build_train_program(m.program, m.loss, o);
    REQUIRE(count_ops(m.program, "mul") == 2);
    CHECK(fuse_matmul_bias(m.program, t.read_back) == 2);
    CHECK(count_ops(m.program, "mul") == 0);
    for (const OpDesc& op : m.program.ops())
      if (op.type == "fused_matmul_bias") CHECK(op.attr<bool>("transpose_Y", false));  // mul's Y is [out, in]
  }
  // A mul whose X is flattened after x_num_col_dims is not fused_matmul_bias's product.
  Program wide;
  wide.add_var(var_desc("x", {-1, 3, 4}, DType::f32));
  for (const auto& [name, shape] : std::vector<std::pair<std::string, Shape>>{{"w", {5, 12}}, {"b", {5}}}) {
    VarDesc v = var_desc(name, shape, DType::f32);
    v.persistable = true;
    wide.add_var(v);
  }
  wide.append_op(make_op("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"t"}}}, {{"x_num_col_dims", int64_t{1}}}));
  wide.append_op(make_op("elementwise_add", {{"X", {"t"}}, {"Y", {"b"}}}, {{"Out", {"out"}}}));
  CHECK(fuse_matmul_bias(wide, {}) == 0);
}

TEST_CASE("fuse_matmul_bias leaves alone a product read elsewhere or kept", "[fuse]") {
  auto program = [](bool second_reader) {
    Program p;
    for (const auto& [name, shape] :
         std::vector<std::pair<std::string, Shape>>{{"x", {2, 3}}, {"w", {3, 4}}, {"b", {4}}, {"m", {2, 4}}}) {
      VarDesc v = var_desc(name, shape, DType::f32);
      v.persistable = true;
      p.add_var(v);
    }
    p.append_op(make_op("matmul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"t"}}}));
    p.append_op(make_op("elementwise_add", {{"X", {"t"}}, {"Y", {"b"}}}, {{"Out", {"out"}}}, {{"axis", int64_t{-1}}}));
    if (second_reader) p.append_op(make_op("elementwise_add", {{"X", {"t"}}, {"Y", {"m"}}}, {{"Out", {"out2"}}}));
    return p;
  };
  Program plain = program(false), read_twice = program(true), kept = program(false);
  CHECK(fuse_matmul_bias(plain, {}) == 1);
  CHECK(fuse_matmul_bias(read_twice, {}) == 0);
  CHECK(fuse_matmul_bias(kept, {"t"}) == 0);
  // A bias over another axis (a [2] vector added along dim 0) is not a linear layer's.
  Program other_axis;
  for (const auto& [name, shape] : std::vector<std::pair<std::string, Shape>>{{"x", {2, 3}}, {"w", {3, 2}}, {"b", {2}}})
    other_axis.add_var(var_desc(name, shape, DType::f32));
  other_axis.append_op(make_op("matmul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"t"}}}));
  other_axis.append_op(
      make_op("elementwise_add", {{"X", {"t"}}, {"Y", {"b"}}}, {{"Out", {"out"}}}, {{"axis", int64_t{0}}}));
  CHECK(fuse_matmul_bias(other_axis, {}) == 0);
}

TEST_CASE("FP32 training with the bias fused gives the bits of training without; AMP the same losses within FP16",
          "[fuse]") {
  // FP32, the pass on and off: `layers` fused, and the same bits.
  const auto same_fp32_training = [](const std::function<models::Model()>& build, int layers) {
    TrainOptions o{.steps = 3, .batch = 2};
    TrainedModel fused = train_steps(build(), o);
    o.fuse_matmul_bias = false;
    TrainedModel apart = train_steps(build(), o);
    CHECK(count_ops(fused.model.program, "fused_matmul_bias") == layers);
    CHECK(count_ops(apart.model.program, "fused_matmul_bias") == 0);
    expect_same_training(fused, apart);
  };
  same_fp32_training(tiny_gpt, 8);
  same_fp32_training(small_mlp, 2);  // the MLP's mul + bias

  // AMP: one rounding fewer per linear layer, so not the same bits, but the
  // same training: each step's loss within a few FP16 roundings of the other's.
  TrainOptions a{.amp = true, .steps = 3, .batch = 2};
  TrainedModel amp_fused = train_steps(tiny_gpt(), a);
  a.fuse_matmul_bias = false;
  TrainedModel amp_apart = train_steps(tiny_gpt(), a);
  CHECK(count_ops(amp_fused.model.program, "fused_matmul_bias") == 8);
  REQUIRE(amp_fused.losses.size() == amp_apart.losses.size());
  for (size_t s = 0; s < amp_fused.losses.size(); ++s) {
    INFO("step " << s + 1);
    // The loss is about ln(40) = 3.7, FP16's half ulp there 2^-10; the two
    // programs differ by one rounding per linear output, which moves the loss
    // by a few such units at most: 1e-2 is ample. (The fused op's math is
    // checked exactly above, and in FP32 whole steps give the same bits.)
    CHECK(std::fabs(amp_fused.losses[s] - amp_apart.losses[s]) < 1e-2);
  }
}
