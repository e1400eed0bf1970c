// amp::rewrite and the AMP training program: casts exactly where the precision
// rules put them, custom lists move ops, overlaps are errors, and the program
// has the AMP step in order (docs/design.md, "The training step").
#include <catch2/catch.hpp>

#include "amp/rewrite.h"
#include "launch/train_program.h"
#include "models/model.h"
#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "tests/unit/amp_test_programs.h"

using namespace mix;
using mix::testing::cast_outputs;
using mix::testing::producer_of;
using mix::testing::small_mlp;

namespace {

size_t index_of_op(const Program& p, const std::string& type, const std::string& output) {
  for (size_t i = 0; i < p.ops().size(); ++i)
    if (p.ops()[i].type == type)
      for (auto& o : p.ops()[i].all_outputs())
        if (o == output) return i;
  FAIL("no " << type << " op writes " << output);
  return 0;
}

size_t index_of_op_reading(const Program& p, const std::string& type, const std::string& input) {
  for (size_t i = 0; i < p.ops().size(); ++i)
    if (p.ops()[i].type == type)
      for (auto& n : p.ops()[i].all_inputs())
        if (n == input) return i;
  FAIL("no " << type << " op reads " << input);
  return 0;
}

}  // namespace

TEST_CASE("default lists: white ops FP16, black ops FP32, gray ops follow", "[amp]") {
  models::Model m = small_mlp();
  amp::RewriteResult r = amp::rewrite(m.program, amp::AmpLists::defaults());
  const Program& p = m.program;

  // White: both muls read FP16 copies of their inputs and weights.
  CHECK(p.var("fc1.mul").dtype == DType::f16);
  CHECK(p.var("fc2.mul").dtype == DType::f16);
  CHECK(producer_of(p, "fc1.mul").in("Y") == "fc1.weight.cast_fp16");
  CHECK(producer_of(p, "fc1.mul").in("X") == "x.cast_fp16");
  // Gray after white: the bias add and relu run in FP16, the bias is cast.
  CHECK(p.var("fc1.out").dtype == DType::f16);
  CHECK(p.var("fc1.relu").dtype == DType::f16);
  CHECK(producer_of(p, "fc1.out").in("Y") == "fc1.bias.cast_fp16");
  // Black: cross-entropy reads an FP32 cast of the FP16 logits; the loss is FP32.
  CHECK(p.var("logits").dtype == DType::f16);
  CHECK(producer_of(p, "loss.per_example").in("Logits") == "logits.cast_fp32");
  CHECK(p.var("loss").dtype == DType::f32);
  // Parameters stay FP32 masters.
  for (auto& name : p.parameters()) CHECK(p.var(name).dtype == DType::f32);

  // Exactly these casts, each made once: the input, four parameters, the logits.
  std::vector<std::string> casts = cast_outputs(p);
  std::sort(casts.begin(), casts.end());
  CHECK(casts == std::vector<std::string>{"fc1.bias.cast_fp16", "fc1.weight.cast_fp16", "fc2.bias.cast_fp16",
                                          "fc2.weight.cast_fp16", "logits.cast_fp32", "x.cast_fp16"});
  CHECK(r.casts_inserted == 6);
}

TEST_CASE("a gray op fed only by feeds and parameters keeps their dtype", "[amp]") {
  Program p;
  p.add_var(VarDesc{"x", {-1, 4}, DType::f32, false, false, true, {}});
  p.append_op(make_op("relu", {{"X", {"x"}}}, {{"Out", {"y"}}}));
  p.append_op(make_op("mean", {{"X", {"y"}}}, {{"Out", {"loss"}}}));
  amp::rewrite(p, amp::AmpLists::defaults());
  CHECK(p.var("y").dtype == DType::f32);
  CHECK(cast_outputs(p).empty());
}

TEST_CASE("a gray op with a black producer runs in FP32 even next to a white one", "[amp]") {
  Program p;
  p.add_var(VarDesc{"x", {-1, 4}, DType::f32, false, false, true, {}});
  p.add_var(VarDesc{"w", {4, 4}, DType::f32, true, true, false, {}});
  p.append_op(make_op("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"a"}}}));              // white -> f16
  p.append_op(make_op("softmax", {{"X", {"x"}}}, {{"Out", {"b"}}}));                        // black -> f32
  p.append_op(make_op("elementwise_add", {{"X", {"a"}}, {"Y", {"b"}}}, {{"Out", {"c"}}}));  // gray
  amp::rewrite(p, amp::AmpLists::defaults());
  CHECK(p.var("a").dtype == DType::f16);
  CHECK(p.var("c").dtype == DType::f32);
  CHECK(producer_of(p, "c").in("X") == "a.cast_fp32");
}

TEST_CASE("a gray op fed by an unlisted op runs in FP32 even next to a white one", "[amp]") {
  // Paddle puts an op in no list on the black side: what it feeds stays FP32.
  Program p;
  p.add_var(VarDesc{"x", {-1, 4}, DType::f32, false, false, true, {}});
  p.add_var(VarDesc{"w", {4, 4}, DType::f32, true, true, false, {}});
  p.append_op(make_op("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"a"}}}));              // white -> f16
  p.append_op(make_op("relu", {{"X", {"x"}}}, {{"Out", {"b"}}}));                           // unlisted below -> f32
  p.append_op(make_op("elementwise_add", {{"X", {"a"}}, {"Y", {"b"}}}, {{"Out", {"c"}}}));  // gray
  amp::AmpLists lists = amp::AmpLists::defaults();
  lists.gray.erase("relu");
  amp::rewrite(p, lists);
  CHECK(p.var("a").dtype == DType::f16);
  CHECK(p.var("b").dtype == DType::f32);
  CHECK(p.var("c").dtype == DType::f32);
  CHECK(producer_of(p, "c").in("X") == "a.cast_fp32");
  CHECK(producer_of(p, "c").in("Y") == "b");
}

TEST_CASE("a variable read by several FP16 ops is cast once", "[amp]") {
  // Two white ops read the same input and weight: one cast of each, read by both
  // (the FP16 weight made once per step, however many ops use it).
  Program p;
  p.add_var(VarDesc{"x", {-1, 4}, DType::f32, false, false, true, {}});
  p.add_var(VarDesc{"w", {4, 4}, DType::f32, true, true, false, {}});
  p.append_op(make_op("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"a"}}}));
  p.append_op(make_op("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"b"}}}));
  const amp::RewriteResult r = amp::rewrite(p, amp::AmpLists::defaults());
  std::vector<std::string> casts = cast_outputs(p);
  std::sort(casts.begin(), casts.end());
  CHECK(casts == std::vector<std::string>{"w.cast_fp16", "x.cast_fp16"});
  CHECK(r.casts_inserted == 2);
  for (const char* out : {"a", "b"}) {
    CHECK(producer_of(p, out).in("X") == "x.cast_fp16");
    CHECK(producer_of(p, out).in("Y") == "w.cast_fp16");
  }
}

TEST_CASE("layer_norm in FP16 keeps its scale, bias and statistics FP32", "[amp]") {
  // The Transformer's layer_norms read the FP32 residual stream; here one reads
  // a white op's FP16 output, so it runs in FP16 with FP32 parameters.
  Program p;
  p.add_var(VarDesc{"x", {-1, 4}, DType::f32, false, false, true, {}});
  p.add_var(VarDesc{"w", {4, 4}, DType::f32, true, true, false, {}});
  p.add_var(VarDesc{"ln.weight", {4}, DType::f32, true, true, false, {}});
  p.add_var(VarDesc{"ln.bias", {4}, DType::f32, true, true, false, {}});
  p.append_op(make_op("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"a"}}}));
  p.append_op(make_op("layer_norm", {{"X", {"a"}}, {"Scale", {"ln.weight"}}, {"Bias", {"ln.bias"}}},
                      {{"Y", {"y"}}, {"Mean", {"mean"}}, {"Variance", {"variance"}}},
                      {{"begin_norm_axis", int64_t{1}}, {"epsilon", 1e-5}}));
  amp::rewrite(p, amp::AmpLists::defaults());
  const OpDesc& ln = producer_of(p, "y");
  CHECK(p.var("y").dtype == DType::f16);
  CHECK(ln.in("X") == "a");
  CHECK(ln.in("Scale") == "ln.weight");
  CHECK(ln.in("Bias") == "ln.bias");
  CHECK(p.var("mean").dtype == DType::f32);
  CHECK(p.var("variance").dtype == DType::f32);
  CHECK_FALSE(p.has_var("ln.weight.cast_fp16"));
  CHECK_FALSE(p.has_var("ln.bias.cast_fp16"));
}

TEST_CASE("unlisted ops run in FP32", "[amp]") {
  models::Model m = small_mlp();
  // Take relu out of the gray list: it becomes unlisted and must run in FP32.
  amp::AmpLists lists = amp::AmpLists::defaults();
  lists.gray.erase("relu");
  amp::rewrite(m.program, lists);
  CHECK(m.program.var("fc1.relu").dtype == DType::f32);
  CHECK(producer_of(m.program, "fc1.relu").in("X") == "fc1.out.cast_fp32");
  // and fc2's mul casts relu's FP32 output back to FP16
  CHECK(producer_of(m.program, "fc2.mul").in("X") == "fc1.relu.cast_fp16");
}

TEST_CASE("the Transformer's fused_attention under the default lists: FP16 inputs and output, FP32 statistics",
          "[amp]") {
  const models::TransformerConfig tc{.layers = 1, .d_model = 16, .heads = 2, .context = 8, .vocab = 32};
  models::Model m = models::build_transformer(tc);
  amp::rewrite(m.program, amp::AmpLists::defaults());
  const Program& p = m.program;
  const OpDesc& att = producer_of(p, "transformer.h.0.attn.context");
  REQUIRE(att.type == "fused_attention");
  // White: its heads come from the FP16 c_attn matmul through a gray
  // reshape2, so no cast is needed; it reads them packed, as reshape2 leaves
  // the projection ([B, T, 3, heads, hd]: no split, no transpose).
  CHECK(att.attr<std::string>("layout", "bhtd") == "bthd");
  CHECK(p.var(att.in("QKV")).dtype == DType::f16);
  CHECK(p.var(att.in("QKV")).shape == Shape{-1, 8, 3, 2, 8});
  CHECK(producer_of(p, att.in("QKV")).type == "reshape2");
  CHECK(p.var(att.out("Out")).dtype == DType::f16);
  CHECK(p.var(att.out("LSE")).dtype == DType::f32);
  CHECK_FALSE(p.has_var("transformer.h.0.attn.scores"));
}

TEST_CASE("the unfused Transformer under the default lists: FP32 embeddings and softmax, FP16 matmuls", "[amp]") {
  const models::TransformerConfig tc{
      .layers = 1, .d_model = 16, .heads = 2, .context = 8, .vocab = 32, .fused_attention = false};
  {
    models::Model m = models::build_transformer(tc);
    amp::rewrite(m.program, amp::AmpLists::defaults());
    const Program& p = m.program;
    // lookup_table is black: it reads the FP32 table and writes FP32 embeddings.
    CHECK(p.var("transformer.tok_emb").dtype == DType::f32);
    CHECK(producer_of(p, "transformer.tok_emb").in("W") == "transformer.wte.weight");
    CHECK_FALSE(p.has_var("transformer.wte.weight.cast_fp16"));  // untied: nothing else reads the table
    // The matmuls (white) run in FP16, the attention softmax (black) in FP32 on a cast of the scores.
    CHECK(p.var("transformer.h.0.attn.c_attn.matmul").dtype == DType::f16);
    CHECK(p.var("transformer.h.0.attn.scores").dtype == DType::f16);
    CHECK(p.var("transformer.h.0.attn.att").dtype == DType::f32);
    CHECK(producer_of(p, "transformer.h.0.attn.att").in("X") == "transformer.h.0.attn.scores.cast_fp32");
    // Gray ops follow: GELU after an FP16 matmul is FP16; layer_norm on the FP32
    // residual stream (which starts at the FP32 embeddings) is FP32.
    CHECK(p.var("transformer.h.0.mlp.gelu").dtype == DType::f16);
    CHECK(p.var("transformer.h.0.ln_2.out").dtype == DType::f32);
    CHECK(p.var("transformer.h.0.resid_mlp").dtype == DType::f32);
    CHECK(p.var("logits").dtype == DType::f16);
    CHECK(producer_of(p, "loss.per_example").in("Logits") == "logits.cast_fp32");
  }
  // A custom white list moves softmax to FP16: the scores need no cast, and
  // the probabilities feed the next matmul directly.
  models::Model m = models::build_transformer(tc);
  amp::rewrite(m.program, amp::AmpLists::defaults().with_custom({"softmax"}, {}));
  CHECK(m.program.var("transformer.h.0.attn.att").dtype == DType::f16);
  CHECK(producer_of(m.program, "transformer.h.0.attn.att").in("X") == "transformer.h.0.attn.scores");
  CHECK(producer_of(m.program, "transformer.h.0.attn.context").in("X") == "transformer.h.0.attn.att");
}

TEST_CASE("custom lists move ops; a name in both is an error naming it", "[amp]") {
  SECTION("custom black list keeps mul in FP32: no FP16 anywhere") {
    models::Model m = small_mlp();
    amp::rewrite(m.program, amp::AmpLists::defaults().with_custom({}, {"mul"}));
    for (auto& v : m.program.vars()) CHECK(v.dtype != DType::f16);
    CHECK(cast_outputs(m.program).empty());
  }
  SECTION("custom white list runs softmax_with_cross_entropy in FP16") {
    models::Model m = small_mlp();
    amp::rewrite(m.program, amp::AmpLists::defaults().with_custom({"softmax_with_cross_entropy"}, {}));
    CHECK(producer_of(m.program, "loss.per_example").in("Logits") == "logits");
    CHECK(m.program.var("logits.softmax").dtype == DType::f16);
    // mean is still black: it casts the FP16 per-example loss up.
    CHECK(producer_of(m.program, "loss").in("X") == "loss.per_example.cast_fp32");
  }
  SECTION("overlap") {
    try {
      amp::AmpLists::defaults().with_custom({"relu", "mul"}, {"mul"});
      FAIL("no error for an op in both lists");
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("'mul'") && Catch::Contains("both"));
    }
  }
}

TEST_CASE("build_train_program builds the AMP step in order (docs/design.md)", "[amp]") {
  for (auto mode : {collective::GradReduce::fp16, collective::GradReduce::fp32}) {
    models::Model m = small_mlp();
    launch::TrainProgramOptions o;
    o.optimizer.kind = optim::OptimizerKind::sgd;
    o.grad_reduce = mode;
    o.grad_sync->world_size = 2;
    o.passes = launch::StepPasses::none();
    launch::build_train_program(m.program, m.loss, o);
    const Program& p = m.program;
    INFO(p.str());

    const size_t seed = index_of_op(p, "fill_like_scalar", "loss@GRAD");
    const bool fp16 = mode == collective::GradReduce::fp16;
    const std::string reduced = fp16 ? "fc1.weight.cast_fp16@GRAD" : "fc1.weight@GRAD";
    const size_t produced = index_of_op(p, fp16 ? "mul_grad" : "cast", reduced);
    const size_t start = index_of_op_reading(p, "c_allreduce_start", reduced);
    const size_t wait = index_of_op(p, "c_allreduce_wait", reduced);
    // FP16: the cast to FP32 is fused into the unscale, after the FP16 all-reduce.
    // FP32: the cast stays in backward, before the FP32 all-reduce.
    const size_t unscale =
        index_of_op(p, fp16 ? "cast_check_finite_and_unscale" : "check_finite_and_unscale", "fc1.weight@GRAD");
    const size_t flag_sync = index_of_op(p, "c_allreduce_found_inf", "found_inf");
    const size_t scaler = index_of_op(p, "update_loss_scaling", "loss_scaling");
    const size_t update = index_of_op(p, "sgd", "fc1.weight");
    CHECK(producer_of(p, "loss@GRAD").in("X") == "loss_scaling");
    CHECK(seed < produced);
    CHECK(produced < start);
    CHECK(start < wait);
    CHECK(wait < unscale);
    CHECK(unscale < flag_sync);
    CHECK(flag_sync < scaler);
    CHECK(scaler < update);
    if (fp16) {
      for (auto& op : p.ops()) CHECK_FALSE((op.type == "cast" && op.out("Out") == "fc1.weight@GRAD"));
    }
    // Every update op is gated by the global flag.
    for (auto& op : p.ops())
      if (op.type == "sgd" || op.type == "increment_step") CHECK(op.in("SkipUpdate") == "found_inf");
  }
}

TEST_CASE("FP32 training has no casts and reduces FP32 gradients", "[amp]") {
  models::Model m = small_mlp();
  launch::TrainProgramOptions o;
  o.precision = amp::Precision::fp32;
  o.optimizer.kind = optim::OptimizerKind::sgd;
  o.passes = launch::StepPasses::none();
  launch::build_train_program(m.program, m.loss, o);
  CHECK(cast_outputs(m.program).empty());
  for (auto& op : m.program.ops())
    if (op.type == "c_allreduce_start")
      for (auto& n : op.ins("X")) CHECK(m.program.var(n).dtype == DType::f32);
}
