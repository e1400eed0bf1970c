// amp::fold_widening_casts, amp::fold_widening_grad_casts and
// amp::fold_casts_into_producers (amp/fold_casts.h): which casts they remove
// and which they keep, that the ops they feed FP16 values compute what they
// computed on the FP32 casts bit for bit (tests/unit/widening_check.h, here on
// the CPU), and that whole AMP training steps of the MLP, the Transformer and a
// ResNet fed 8-bit pixels give bit-identical losses and parameters with and
// without the passes.
#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "amp/fold_casts.h"
#include "amp/rewrite.h"
#include "models/model.h"
#include "runtime/core/check.h"
#include "runtime/ir/autodiff.h"
#include "tests/unit/amp_test_programs.h"
#include "tests/unit/train_steps.h"
#include "tests/unit/widening_check.h"

using namespace mix;

namespace {

// The unfused attention: its causal softmax, after the FP16 scores, is what the fold passes fold.
const models::TransformerConfig kTinyTransformer{
    .layers = 2, .d_model = 16, .heads = 2, .context = 8, .vocab = 32, .fused_attention = false};

using mix::testing::producer_of;
using mix::testing::small_mlp;
using mix::testing::train_steps;
using mix::testing::TrainedModel;
using mix::testing::TrainOptions;

// The program's casts, by output name.
std::multiset<std::string> casts_of(const Program& p) {
  const std::vector<std::string> v = mix::testing::cast_outputs(p);
  return {v.begin(), v.end()};
}

}  // namespace

TEST_CASE("fold_widening_casts: softmax, cross-entropy and residual adds read the FP16 values; no other cast moves",
          "[amp][fold]") {
  SECTION("MLP: the logits") {
    models::Model m = small_mlp();
    amp::rewrite(m.program, amp::AmpLists::defaults());
    const std::multiset<std::string> before = casts_of(m.program);
    const size_t ops_before = m.program.ops().size();
    CHECK(amp::fold_widening_casts(m.program) == 1);
    const Program& p = m.program;
    std::multiset<std::string> want = before;
    want.erase("logits.cast_fp32");
    CHECK(casts_of(p) == want);
    CHECK(p.ops().size() == ops_before - 1);
    const OpDesc& xent = producer_of(p, "loss.per_example");
    CHECK(xent.in("Logits") == "logits");
    CHECK(xent.attr<std::string>("out_dtype", "") == "f32");
    CHECK(p.var("logits").dtype == DType::f16);
    // Still FP32 outputs, as the black list says: the loss, and the softmax backward reads.
    CHECK(p.var("loss.per_example").dtype == DType::f32);
    CHECK(p.var("logits.softmax").dtype == DType::f32);
    CHECK(p.var("loss").dtype == DType::f32);
    // Running it again finds nothing left to fold.
    CHECK(amp::fold_widening_casts(m.program) == 0);
  }
  SECTION("Transformer: each layer's attention scores and residual adds, and the logits") {
    models::Model m = models::build_transformer(kTinyTransformer);
    amp::rewrite(m.program, amp::AmpLists::defaults());
    const std::multiset<std::string> before = casts_of(m.program);
    CHECK(amp::fold_widening_casts(m.program) == 3 * kTinyTransformer.layers + 1);
    const Program& p = m.program;
    std::multiset<std::string> want = before;
    want.erase("logits.cast_fp32");
    for (int l = 0; l < kTinyTransformer.layers; ++l) {
      const std::string h = "transformer.h." + std::to_string(l) + ".attn.";
      want.erase(h + "scores.cast_fp32");
      const OpDesc& sm = producer_of(p, h + "att");
      CHECK(sm.in("X") == h + "scores");
      CHECK(sm.attr<std::string>("out_dtype", "") == "f32");
      CHECK(sm.attr<bool>("causal", false));
      CHECK(p.var(h + "att").dtype == DType::f32);
      // The probabilities still reach the next (white) matmul through an FP16 cast.
      CHECK(producer_of(p, h + "context").in("X") == h + "att.cast_fp16");
      // Each residual add reads its branch's FP16 output as Y and writes FP32.
      const std::string block = "transformer.h." + std::to_string(l) + ".";
      for (const char* branch : {"attn", "mlp"}) {
        const std::string out = block + branch + ".c_proj.out";
        want.erase(out + ".cast_fp32");
        const OpDesc& add = producer_of(p, block + (std::string(branch) == "attn" ? "resid_attn" : "resid_mlp"));
        CHECK(add.in("Y") == out);
        CHECK(p.var(out).dtype == DType::f16);
        CHECK(p.var(add.in("X")).dtype == DType::f32);
        CHECK(p.var(add.out("Out")).dtype == DType::f32);
      }
    }
    CHECK(casts_of(p) == want);
    CHECK(producer_of(p, "loss.per_example").in("Logits") == "logits");
  }
  SECTION("BF16 casts fold as FP16 ones do") {
    models::Model m = small_mlp();
    amp::rewrite(m.program, amp::AmpLists::defaults(), DType::bf16);
    CHECK(amp::fold_widening_casts(m.program) == 1);
    CHECK(producer_of(m.program, "loss.per_example").in("Logits") == "logits");
    CHECK(m.program.var("logits").dtype == DType::bf16);
  }
}

TEST_CASE("fold_widening_casts keeps casts with another reader, or several widening ones", "[amp][fold]") {
  Program p;
  p.add_var(VarDesc{"x", {-1, 4}, DType::f32, false, false, true, {}});
  p.add_var(VarDesc{"w", {4, 4}, DType::f32, true, true, false, {}});
  p.append_op(make_op("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"a"}}}));  // white: FP16 a
  p.append_op(make_op("softmax", {{"X", {"a"}}}, {{"Out", {"b"}}}));            // black: reads a.cast_fp32
  p.append_op(make_op("tanh", {{"X", {"a"}}}, {{"Out", {"t"}}}));               // unlisted: FP32, reads a.cast_fp32 too
  p.append_op(make_op("elementwise_add", {{"X", {"b"}}, {"Y", {"t"}}}, {{"Out", {"c"}}}));
  amp::AmpLists lists = amp::AmpLists::defaults();
  lists.gray.erase("tanh");
  amp::rewrite(p, lists);
  REQUIRE(producer_of(p, "b").in("X") == "a.cast_fp32");
  REQUIRE(producer_of(p, "t").in("X") == "a.cast_fp32");
  // tanh needs the FP32 copy anyway, so softmax keeps reading it.
  CHECK(amp::fold_widening_casts(p) == 0);
  CHECK(producer_of(p, "b").in("X") == "a.cast_fp32");
  CHECK_FALSE(producer_of(p, "b").has_attr("out_dtype"));

  // Two softmax ops reading one cast: folded, each would round its own part of
  // a's gradient to FP16 before the parts are added, where the cast's gradient
  // rounds their FP32 sum once. Not bit-identical, so the cast stays.
  Program two;
  two.add_var(VarDesc{"x", {-1, 4}, DType::f32, false, false, true, {}});
  two.add_var(VarDesc{"w", {4, 4}, DType::f32, true, true, false, {}});
  two.append_op(make_op("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"a"}}}));
  two.append_op(make_op("softmax", {{"X", {"a"}}}, {{"Out", {"b1"}}}));
  two.append_op(make_op("softmax", {{"X", {"a"}}}, {{"Out", {"b2"}}}));
  amp::rewrite(two, amp::AmpLists::defaults());
  REQUIRE(producer_of(two, "b1").in("X") == "a.cast_fp32");
  REQUIRE(producer_of(two, "b2").in("X") == "a.cast_fp32");
  CHECK(amp::fold_widening_casts(two) == 0);
  CHECK(producer_of(two, "b1").in("X") == "a.cast_fp32");
  CHECK(producer_of(two, "b2").in("X") == "a.cast_fp32");

  // With softmax in the custom white list there is no cast to fold.
  models::Model m = models::build_transformer(kTinyTransformer);
  amp::rewrite(m.program, amp::AmpLists::defaults().with_custom({"softmax"}, {}));
  CHECK(amp::fold_widening_casts(m.program) == 1 + 2 * kTinyTransformer.layers);  // the logits and residual adds
  CHECK(m.program.var("transformer.h.0.attn.att").dtype == DType::f16);
}

TEST_CASE("fold_widening_casts: a residual add takes the FP16 operand as Y; a broadcast or FP16 partner keeps the cast",
          "[amp][fold]") {
  const auto f16_feed = [](Program& p, const std::string& name, Shape shape) {
    p.add_var(VarDesc{name, std::move(shape), DType::f16, false, false, true, {}});
  };
  const auto widen = [](Program& p, const std::string& in) {
    p.append_op(make_op("cast", {{"X", {in}}}, {{"Out", {in + ".cast_fp32"}}}, {{"out_dtype", std::string("f32")}}));
  };
  Program p;
  p.add_var(VarDesc{"x", {-1, 4}, DType::f32, false, false, true, {}});
  for (const char* n : {"a", "c", "d"}) f16_feed(p, n, {-1, 4});
  f16_feed(p, "bias", {4});
  for (const char* n : {"a", "c", "d", "bias"}) widen(p, n);
  // The cast on X: the add commutes, so the FP16 value becomes its Y.
  p.append_op(make_op("elementwise_add", {{"X", {"a.cast_fp32"}}, {"Y", {"x"}}}, {{"Out", {"r1"}}}));
  // Two casts into one add: the first folds; then the other operand is FP16, so the second stays.
  p.append_op(make_op("elementwise_add", {{"X", {"c.cast_fp32"}}, {"Y", {"d.cast_fp32"}}}, {{"Out", {"r2"}}}));
  // A broadcast bias: a narrow Y must have X's shape.
  p.append_op(make_op("elementwise_add", {{"X", {"r1"}}, {"Y", {"bias.cast_fp32"}}}, {{"Out", {"r3"}}}));
  CHECK(amp::fold_widening_casts(p) == 2);
  const OpDesc& r1 = producer_of(p, "r1");
  CHECK(r1.in("X") == "x");
  CHECK(r1.in("Y") == "a");
  CHECK(p.var("r1").dtype == DType::f32);
  const OpDesc& r2 = producer_of(p, "r2");
  CHECK(r2.in("X") == "d.cast_fp32");
  CHECK(r2.in("Y") == "c");
  CHECK(producer_of(p, "d.cast_fp32").type == "cast");
  CHECK(producer_of(p, "r3").in("Y") == "bias.cast_fp32");
  CHECK(producer_of(p, "bias.cast_fp32").type == "cast");
  CHECK(amp::fold_widening_casts(p) == 0);
}

TEST_CASE("fold_widening_casts keeps a cast whose input is written before its reader", "[amp][fold]") {
  // Folded, softmax would read a at its own place, after a is scaled in place
  // (by name, or through a view of it): the cast took a's values before that.
  for (bool through_view : {false, true}) {
    INFO((through_view ? "written through a view" : "written by name"));
    Program p;
    p.add_var(VarDesc{"a", {-1, 4}, DType::f16, false, false, true, {}});
    p.append_op(make_op("cast", {{"X", {"a"}}}, {{"Out", {"a.cast_fp32"}}}, {{"out_dtype", std::string("f32")}}));
    std::string written = "a";
    if (through_view) {
      p.append_op(make_op("reshape2", {{"X", {"a"}}}, {{"Out", {"av"}}}, {{"shape", std::vector<int64_t>{0, 2, 2}}}));
      written = "av";
    }
    p.append_op(make_op("scale", {{"X", {written}}}, {{"Out", {written}}}, {{"scale", 2.0}}));
    p.append_op(make_op("softmax", {{"X", {"a.cast_fp32"}}}, {{"Out", {"b"}}}));
    CHECK(amp::fold_widening_casts(p) == 0);
    CHECK(producer_of(p, "b").in("X") == "a.cast_fp32");
  }
}

TEST_CASE("fold_widening_casts keeps a cast whose FP32 output is persistable", "[amp][fold]") {
  // It lives past the step, for whoever reads it then: the cast must still write it.
  Program p;
  p.add_var(VarDesc{"a", {-1, 4}, DType::f16, false, false, true, {}});
  p.append_op(make_op("cast", {{"X", {"a"}}}, {{"Out", {"a.cast_fp32"}}}, {{"out_dtype", std::string("f32")}}));
  p.append_op(make_op("softmax", {{"X", {"a.cast_fp32"}}}, {{"Out", {"b"}}}));
  Program persistable = p;
  persistable.var("a.cast_fp32").persistable = true;
  CHECK(amp::fold_widening_casts(p) == 1);  // not vacuous: folded otherwise
  CHECK(amp::fold_widening_casts(persistable) == 0);
  CHECK(producer_of(persistable, "b").in("X") == "a.cast_fp32");
  CHECK(producer_of(persistable, "a.cast_fp32").type == "cast");
}

TEST_CASE("fold_casts_into_producers: image_normalize stores the first conv's FP16 or BF16 input itself",
          "[amp][fold]") {
  for (DType low : {DType::f16, DType::bf16})
    for (bool channels_last : {false, true}) {
      INFO(dtype_name(low) << (channels_last ? " NHWC" : " NCHW"));
      models::Model m = mix::testing::narrow_resnet(channels_last, 8, false, mix::testing::imagenet_pixels());
      amp::rewrite(m.program, amp::AmpLists::defaults(), low);
      // In no AMP list, image_normalize runs in FP32; the white conv2d reads a cast of its output.
      const std::string wide = m.program.ops().front().out("Out");
      const std::string narrow = amp::cast_var_name(wide, low);
      REQUIRE(producer_of(m.program, narrow).type == "cast");
      REQUIRE(producer_of(m.program, "conv1.out").in("Input") == narrow);
      const size_t casts = casts_of(m.program).size();
      CHECK(amp::fold_widening_casts(m.program) == 1);  // the logits' cast, not this one
      CHECK(amp::fold_casts_into_producers(m.program) == 1);
      CHECK(casts_of(m.program).size() == casts - 2);
      const OpDesc& normalize = producer_of(m.program, narrow);
      CHECK(normalize.type == "image_normalize");
      CHECK(normalize.attr<std::string>("out_dtype", "") == dtype_name(low));
      CHECK(m.program.var(narrow).dtype == low);
      CHECK(producer_of(m.program, "conv1.out").in("Input") == narrow);
      CHECK(m.program.readers(wide).empty());
      CHECK(amp::fold_casts_into_producers(m.program) == 0);  // nothing left to fold
    }
}

TEST_CASE("fold_casts_into_producers keeps a cast the FP32 value has other readers of, and other casts",
          "[amp][fold]") {
  Program p;
  p.add_var(VarDesc{"x", {-1, 4, 4, 3}, DType::u8, false, false, true, {}});
  p.append_op(make_op("image_normalize", {{"X", {"x"}}}, {{"Out", {"a"}}},
                      {{"mean", std::vector<double>{0.5, 0.5, 0.5}}, {"std", std::vector<double>{0.2, 0.2, 0.2}}}));
  p.append_op(make_op("cast", {{"X", {"a"}}}, {{"Out", {"a.cast_fp16"}}}, {{"out_dtype", std::string("f16")}}));
  Program two_readers = p;
  two_readers.append_op(make_op("relu", {{"X", {"a"}}}, {{"Out", {"r"}}}));  // still needs the FP32 values
  CHECK(amp::fold_casts_into_producers(two_readers) == 0);
  CHECK(producer_of(two_readers, "a.cast_fp16").type == "cast");
  // A cast of another op's output: relu does not round on store to a dtype of its choice.
  Program other;
  other.add_var(VarDesc{"y", {-1, 4}, DType::f32, false, false, true, {}});
  other.append_op(make_op("relu", {{"X", {"y"}}}, {{"Out", {"b"}}}));
  other.append_op(make_op("cast", {{"X", {"b"}}}, {{"Out", {"b.cast_fp16"}}}, {{"out_dtype", std::string("f16")}}));
  CHECK(amp::fold_casts_into_producers(other) == 0);
  // An FP16 image_normalize cast on to BF16 would round twice: kept.
  Program twice = p;
  twice.append_op(
      make_op("cast", {{"X", {"a.cast_fp16"}}}, {{"Out", {"a.cast_bf16"}}}, {{"out_dtype", std::string("bf16")}}));
  CHECK(amp::fold_casts_into_producers(twice) == 1);  // the first cast only
  CHECK(producer_of(twice, "a.cast_bf16").type == "cast");
  CHECK(producer_of(twice, "a.cast_fp16").type == "image_normalize");
  CHECK(amp::fold_casts_into_producers(p) == 1);  // not vacuous: folded otherwise
}

TEST_CASE("fold_casts_into_producers: layer_norm stores the FP16 or BF16 input of the linear layer after it",
          "[amp][fold]") {
  for (DType low : {DType::f16, DType::bf16}) {
    INFO(dtype_name(low));
    models::Model m = models::build_transformer(kTinyTransformer);
    amp::rewrite(m.program, amp::AmpLists::defaults(), low);
    amp::fold_widening_casts(m.program);
    std::vector<std::string> norms;
    for (int l = 0; l < kTinyTransformer.layers; ++l)
      for (const char* n : {".ln_1", ".ln_2"}) norms.push_back("transformer.h." + std::to_string(l) + n);
    norms.push_back("transformer.ln_f");
    for (const std::string& n : norms)
      REQUIRE(producer_of(m.program, amp::cast_var_name(n + ".out", low)).type == "cast");
    const size_t casts = casts_of(m.program).size();
    CHECK(amp::fold_casts_into_producers(m.program) == static_cast<int>(norms.size()));
    CHECK(casts_of(m.program).size() == casts - norms.size());
    for (const std::string& n : norms) {
      const std::string narrow = amp::cast_var_name(n + ".out", low);
      const OpDesc& ln = producer_of(m.program, narrow);
      CHECK(ln.type == "layer_norm");
      CHECK(ln.attr<std::string>("out_dtype", "") == dtype_name(low));
      CHECK(m.program.var(narrow).dtype == low);
      CHECK(m.program.var(ln.in("X")).dtype == DType::f32);
      CHECK(m.program.var(ln.out("Mean")).dtype == DType::f32);
      CHECK(m.program.readers(n + ".out").empty());
    }
    CHECK(amp::fold_casts_into_producers(m.program) == 0);  // nothing left to fold
    // The gradient reads the narrow output's gradient itself: no cast to FP32 before it.
    seed_loss_gradient(m.program, m.loss, "");
    append_backward(m.program, m.loss);
    for (const std::string& n : norms) {
      const std::string dy = amp::cast_var_name(n + ".out", low) + "@GRAD";
      const auto readers = m.program.readers(dy);
      REQUIRE(readers.size() == 1);
      const OpDesc& g = m.program.ops()[readers.front().first];
      CHECK(g.type == "layer_norm_grad");
      CHECK(m.program.var(dy).dtype == low);
      CHECK(m.program.var(g.out("X@GRAD")).dtype == DType::f32);
    }
  }
}

TEST_CASE("residual add and layer_norm with narrow operands on the CPU: the values of the ops on the FP32 casts",
          "[amp][fold]") {
  for (DType narrow : {DType::f16, DType::bf16}) {
    for (const Shape& s : {Shape{7, 10}, Shape{2, 3, 64}, Shape{3, 1030}})
      mix::testing::check_narrow_residual_add(cpu_device(), narrow, s);
    for (const Shape& s : {Shape{7, 10}, Shape{2, 3, 64}, Shape{4, 1100}})
      mix::testing::check_narrowing_layer_norm(cpu_device(), narrow, s);
  }
}

TEST_CASE("layer_norm's out_dtype and its gradient's dtypes: what is not supported is an error",
          "[amp][fold][errors]") {
  Program p;
  p.add_var(VarDesc{"x16", {-1, 4}, DType::f16, false, false, true, {}});
  CHECK_THROWS_WITH(p.append_op(make_op("layer_norm", {{"X", {"x16"}}}, {{"Y", {"y"}}},
                                        {{"begin_norm_axis", int64_t{1}}, {"out_dtype", std::string("f32")}})),
                    Catch::Contains("out_dtype f32 with an f16 X is not supported"));
  const Tensor x = mix::testing::random_tensor({2, 4}, DType::f16, 1);
  const Tensor dy = mix::testing::random_tensor({2, 4}, DType::f32, 2);
  const Tensor stats = mix::testing::random_tensor({2}, DType::f32, 3, 0.5f, 1.f);
  CHECK_THROWS_WITH(
      mix::testing::run_ops_on(
          {make_op("layer_norm_grad", {{"X", {"x"}}, {"Mean", {"m"}}, {"Variance", {"v"}}, {"Y@GRAD", {"dy"}}},
                   {{"X@GRAD", {"dx"}}}, {{"begin_norm_axis", int64_t{1}}})},
          {{"x", x}, {"m", stats}, {"v", stats}, {"dy", dy}}, cpu_device(), ExecEnv{}, {"dx"}),
      Catch::Contains("Y@GRAD f32[2, 4] does not match X f16[2, 4]"));
}

TEST_CASE("fold_widening_grad_casts: softmax_grad reads the FP16 gradient of attention's probabilities",
          "[amp][fold]") {
  for (double dropout : {0.0, 0.1}) {
    INFO("dropout " << dropout);
    models::TransformerConfig tc = kTinyTransformer;
    tc.dropout = dropout;
    models::Model m = models::build_transformer(tc);
    amp::rewrite(m.program, amp::AmpLists::defaults());
    amp::fold_widening_casts(m.program);
    seed_loss_gradient(m.program, m.loss, "");
    append_backward(m.program, m.loss);
    const int folded = amp::fold_widening_grad_casts(m.program);
    for (int l = 0; l < tc.layers; ++l) {
      const std::string h = "transformer.h." + std::to_string(l) + ".attn.";
      const OpDesc& g = producer_of(m.program, h + "scores@GRAD");
      REQUIRE(g.type == "softmax_grad");
      if (dropout == 0) {
        // The probabilities' only reader is their FP16 cast: its gradient comes
        // back FP16, and softmax_grad reads it without the cast to FP32.
        CHECK(g.in("Out@GRAD") == h + "att.cast_fp16@GRAD");
        CHECK(m.program.var(g.in("Out@GRAD")).dtype == DType::f16);
      } else {
        // Dropout (FP32, after the black softmax) reads them: its FP32
        // gradient is what softmax_grad reads, and there is no cast to fold.
        CHECK(g.in("Out@GRAD") == h + "att@GRAD");
        CHECK(m.program.var(g.in("Out@GRAD")).dtype == DType::f32);
      }
    }
    CHECK(folded == (dropout == 0 ? tc.layers : 0));
    for (const OpDesc& op : m.program.ops())
      if (op.type == "cast") CHECK(op.out("Out").find(".attn.att@GRAD") == std::string::npos);
  }
}

TEST_CASE("out_dtype and x_grad_dtype refuse narrowing", "[amp][fold]") {
  Program p;
  p.add_var(VarDesc{"x", {2, 3}, DType::f32, false, false, true, {}});
  try {
    p.append_op(make_op("softmax", {{"X", {"x"}}}, {{"Out", {"y"}}}, {{"out_dtype", std::string("f16")}}));
    FAIL("no error for softmax with out_dtype f16 on an f32 X");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("out_dtype f16") && Catch::Contains("f32 input"));
  }
}

TEST_CASE("softmax and cross-entropy with out_dtype f32 on the CPU: the values of the op on the FP32 cast",
          "[amp][fold][softmax]") {
  for (DType narrow : {DType::f16, DType::bf16}) {
    for (const Shape& s : {Shape{7, 10}, Shape{2, 3, 64}, Shape{4, 1100}, Shape{1, 1}})
      mix::testing::check_widening_softmax(cpu_device(), narrow, s, false);
    for (const Shape& s : {Shape{2, 3, 8}, Shape{1, 3, 20}})
      mix::testing::check_widening_softmax(cpu_device(), narrow, s, true);
    for (const Shape& s : {Shape{16, 10}, Shape{3, 5, 300}, Shape{4, 2000}})
      mix::testing::check_widening_cross_entropy(cpu_device(), narrow, s);
  }
}

namespace {

// 4 AMP momentum-SGD steps of the model that `build` makes (tests/unit/train_steps.h), with or without the passes.
TrainedModel amp_steps(const std::function<models::Model()>& build, bool fold, DType low) {
  return train_steps(build(), TrainOptions{.amp = true, .low = low, .fold_casts = fold, .steps = 4, .batch = 3});
}

// `removed`: the casts the two passes take out of the model's AMP program.
void check_same_training(const std::function<models::Model()>& build, int removed, DType low = DType::f16) {
  const TrainedModel folded = amp_steps(build, true, low), plain = amp_steps(build, false, low);
  CHECK(casts_of(plain.model.program).size() - casts_of(folded.model.program).size() == static_cast<size_t>(removed));
  // Every step of both runs was applied: each one moved the parameters.
  for (const TrainedModel* run : {&folded, &plain})
    for (float f : run->found_inf) REQUIRE(f == 0.f);
  mix::testing::expect_same_training(folded, plain);
}

}  // namespace

TEST_CASE("AMP training with folded casts is bit-identical to training with the casts", "[amp][fold]") {
  // The MLP: the logits' cast and its gradient's cast back.
  SECTION("MLP") { check_same_training(small_mlp, 2); }
  // The Transformer: those two for the logits and for each layer's scores,
  // the cast of each layer's probability gradient before softmax_grad, and
  // two for each cast a residual add or a layer_norm no longer needs (its
  // gradient's cast goes with it): two adds and two layer norms a layer, and
  // the final layer norm.
  const int transformer_casts = 3 * kTinyTransformer.layers + 2 + 2 * (4 * kTinyTransformer.layers + 1);
  SECTION("Transformer") {
    check_same_training([] { return models::build_transformer(kTinyTransformer); }, transformer_casts);
  }
  SECTION("Transformer in BF16") {
    check_same_training([] { return models::build_transformer(kTinyTransformer); }, transformer_casts, DType::bf16);
  }
  // A ResNet fed 8-bit pixels: the logits' two casts, and the input's cast
  // folded into image_normalize (channels first and last).
  for (bool channels_last : {false, true})
    for (DType low : {DType::f16, DType::bf16}) {
      DYNAMIC_SECTION("ResNet from pixels, " << (channels_last ? "NHWC " : "NCHW ") << dtype_name(low)) {
        check_same_training(
            [channels_last] {
              return mix::testing::narrow_resnet(channels_last, 8, false, mix::testing::imagenet_pixels());
            },
            3, low);
      }
    }
  // With dropout, which reads attention's probabilities in FP32, only the
  // forward casts and their gradients' go.
  SECTION("Transformer with dropout") {
    models::TransformerConfig tc = kTinyTransformer;
    tc.dropout = 0.1;
    check_same_training([tc] { return models::build_transformer(tc); }, 2 * tc.layers + 2 + 2 * (4 * tc.layers + 1));
  }
}
