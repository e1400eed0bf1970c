// recompute_softmax (runtime/passes/recompute_softmax.h): softmax_with_cross_entropy
// without a stored Softmax. Its grad, recomputing the softmax from Logits and
// RowStats, gives the bits of the grad that reads the stored Softmax, in every
// dtype pairing the op has (FP32; FP16/BF16 alone; FP16/BF16 logits with FP32
// outputs), ignored rows included; the pass rewrites the MLP's and the
// Transformer's loss and leaves alone a Softmax someone else reads or keeps,
// and logits that may not hold the forward's values at the gradient; whole
// training steps give the same bits; the Transformer's planned peak drops.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "models/model.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/passes/recompute_softmax.h"
#include "tests/unit/amp_test_programs.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/gradcheck.h"
#include "tests/unit/recompute_softmax_check.h"
#include "tests/unit/train_steps.h"

using namespace mix;
using namespace mix::testing;

namespace {

const models::TransformerConfig kTiny{.layers = 2, .d_model = 16, .heads = 2, .context = 8, .vocab = 40};

}  // namespace

TEST_CASE("the recomputed softmax gives the gradient of the stored one, bit for bit", "[recompute_softmax]") {
  // Rows of 10 classes and of 1000;
  // labels 0..9 with 3 ignored (ignore_index 3); logits up to +-30, so some
  // softmax values are tiny and some round to 0 in FP16.
  for (const SoftmaxDtypes& pr : kSoftmaxDtypes)
    for (int64_t classes : {10, 1000}) {
      INFO(dtype_name(pr.logits) << " logits, " << dtype_name(pr.softmax) << " softmax, " << classes << " classes");
      const Shape s{2, 6, classes};
      std::vector<int64_t> labels;
      for (int64_t i = 0; i < 12; ++i) labels.push_back(i % 10);
      const auto [stored, recomputed] = stored_and_recomputed_grads(
          to_dtype(uniform_tensor(s, 4, -30.f, 30.f), pr.logits), i64_tensor({2, 6}, labels), pr.softmax, cpu_device());
      expect_identical(recomputed, stored, "Logits@GRAD");
      // Not vacuous: a real gradient has both signs (softmax - onehot is
      // negative at the label, positive elsewhere).
      const std::vector<float> g = stored.to_floats();
      CHECK(*std::min_element(g.begin(), g.end()) < 0.f);
      CHECK(*std::max_element(g.begin(), g.end()) > 0.f);
    }
}

TEST_CASE("recompute_softmax rewrites the loss of the MLP and the Transformer, not a Softmax someone reads",
          "[recompute_softmax]") {
  for (bool use_amp : {false, true}) {
    INFO((use_amp ? "AMP" : "FP32"));
    for (auto build : {std::function<models::Model()>(small_mlp),
                       std::function<models::Model()>([] { return models::build_transformer(kTiny); })}) {
      models::Model m = build();
      launch::TrainProgramOptions o = program_options(use_amp);
      o.grad_sync.reset();  // no data-parallel pass
      launch::build_train_program(m.program, m.loss, o);
      Program before = m.program;
      REQUIRE(recompute_softmax(m.program, {m.loss}) == 1);
      std::string logits;  // what the forward op reads, which the grad now reads too
      for (const OpDesc& op : m.program.ops()) {
        if (op.type == "softmax_with_cross_entropy") {
          logits = op.in("Logits");
          CHECK(op.out_or_empty("Softmax").empty());
          REQUIRE_FALSE(op.out_or_empty("RowStats").empty());
          CHECK(m.program.var(op.out("RowStats")).dtype == DType::f32);
        }
        if (op.type == "softmax_with_cross_entropy_grad") {
          CHECK(op.in_or_empty("Softmax").empty());
          CHECK(op.in("Logits") == logits);
          CHECK(op.attr<std::string>("softmax_dtype", "") == "f32");  // FP32, or AMP's black-list op
        }
      }
      // Nothing else changed: the same ops in the same order.
      REQUIRE(m.program.ops().size() == before.ops().size());
      for (size_t i = 0; i < before.ops().size(); ++i) CHECK(m.program.ops()[i].type == before.ops()[i].type);

      // A Softmax the caller keeps, or that another op reads, stays.
      Program kept = before;
      std::string softmax;
      for (const OpDesc& op : kept.ops())
        if (op.type == "softmax_with_cross_entropy") softmax = op.out("Softmax");
      CHECK(recompute_softmax(kept, {softmax}) == 0);
      Program read = before;
      read.append_op(make_op("scale", {{"X", {softmax}}}, {{"Out", {"probabilities"}}}, {{"scale", 1.0}}));
      CHECK(recompute_softmax(read, {}) == 0);
    }
  }
}

TEST_CASE("recompute_softmax leaves alone what it cannot rewrite", "[recompute_softmax]") {
  // One program per case: x = scale(a), the loss on logits x and its
  // gradient, which would be rewritten but for one thing. The gradient
  // recomputes the softmax from x, so x must still hold the forward's
  // values when it runs.
  auto base = [] {
    Program p;
    for (const char* n : {"a", "c"}) p.add_var(var_desc(n, {-1, 10}, DType::f32));
    p.add_var(var_desc("label", {-1, 1}, DType::i64));
    p.add_var(var_desc("dloss", {-1, 1}, DType::f32));
    return p;
  };
  auto logits = [](Program& p) { p.append_op(make_op("scale", {{"X", {"a"}}}, {{"Out", {"x"}}}, {{"scale", 2.0}})); };
  auto loss = [](Program& p) {
    p.append_op(make_op("softmax_with_cross_entropy", {{"Logits", {"x"}}, {"Label", {"label"}}},
                        {{"Softmax", {"y"}}, {"Loss", {"loss"}}}));
  };
  auto gradient = [](Program& p) {
    OpDesc g = make_op("softmax_with_cross_entropy_grad",
                       {{"Softmax", {"y"}}, {"Label", {"label"}}, {"Loss@GRAD", {"dloss"}}}, {{"Logits@GRAD", {"dx"}}});
    g.role = OpRole::backward;
    p.append_op(g);
  };
  // A program the pass refuses stays as it was.
  auto rewrites = [](Program p) {
    const std::string before = p.str();
    const int n = recompute_softmax(p, {});
    if (n == 0) CHECK(p.str() == before);
    return n;
  };

  SECTION("the pair itself is rewritten") {
    Program p = base();
    logits(p);
    loss(p);
    gradient(p);
    CHECK(rewrites(p) == 1);
  }
  SECTION("the Softmax is persistable") {
    // It lives past the step, for whoever reads it then.
    Program p = base();
    logits(p);
    loss(p);
    gradient(p);
    p.var("y").persistable = true;
    CHECK(rewrites(p) == 0);
  }
  SECTION("another op writes the logits between the loss and its gradient") {
    Program p = base();
    logits(p);
    loss(p);
    p.append_op(make_op("scale", {{"X", {"c"}}}, {{"Out", {"x"}}}, {{"scale", 2.0}}));
    gradient(p);
    CHECK(rewrites(p) == 0);
  }
  SECTION("the logits are a view") {
    // x shares a3's storage: writing a3 in place writes x, under another name.
    Program p = base();
    p.add_var(var_desc("a3", {-1, 2, 5}, DType::f32));
    p.append_op(make_op("reshape2", {{"X", {"a3"}}}, {{"Out", {"x"}}}, {{"shape", std::vector<int64_t>{0, 10}}}));
    loss(p);
    p.append_op(make_op("scale", {{"X", {"a3"}}}, {{"Out", {"a3"}}}, {{"scale", 2.0}}));
    gradient(p);
    CHECK(rewrites(p) == 0);
  }
  SECTION("a view of the logits is made between the loss and its gradient") {
    // v shares x's storage: scaling v in place scales x, which x's own name
    // never shows. Only reading v writes nothing, and the pair is rewritten.
    for (bool in_place : {true, false}) {
      INFO((in_place ? "v scaled in place" : "v only read"));
      Program p = base();
      logits(p);
      loss(p);
      p.append_op(make_op("reshape2", {{"X", {"x"}}}, {{"Out", {"v"}}}, {{"shape", std::vector<int64_t>{0, 2, 5}}}));
      p.append_op(make_op("scale", {{"X", {"v"}}}, {{"Out", {in_place ? "v" : "w"}}}, {{"scale", 2.0}}));
      gradient(p);
      CHECK(rewrites(p) == (in_place ? 0 : 1));
    }
  }
}

TEST_CASE("training with the softmax recomputed gives the bits of training with it stored", "[recompute_softmax]") {
  for (bool use_amp : {false, true}) {
    INFO((use_amp ? "AMP" : "FP32"));
    for (auto build : {std::function<models::Model()>(small_mlp),
                       std::function<models::Model()>([] { return models::build_transformer(kTiny); })}) {
      TrainOptions o{.amp = use_amp, .steps = 3, .batch = 4};
      TrainedModel recomputed = train_steps(build(), o);
      o.recompute_softmax = false;
      TrainedModel stored = train_steps(build(), o);
      CHECK(count_ops(recomputed.model.program, "softmax_with_cross_entropy") == 1);
      for (const TrainedModel* run : {&recomputed, &stored})
        for (float f : run->found_inf) REQUIRE(f == 0.f);  // every AMP step was applied
      expect_same_training(recomputed, stored);
    }
  }
}

TEST_CASE("without the stored softmax the Transformer's planned peak drops under AMP", "[recompute_softmax]") {
  // A vocabulary wide enough for the loss to set the peak: the FP32 Softmax
  // [tokens, vocab] lived from the loss to its gradient; now the FP16 logits do.
  models::TransformerConfig tc = kTiny;
  tc.vocab = 4096;
  models::Model m = models::build_transformer(tc);
  launch::TrainProgramOptions o = program_options(/*use_amp=*/true);
  o.grad_sync.reset();  // no data-parallel pass
  launch::build_train_program(m.program, m.loss, o);
  Program stored = m.program;
  REQUIRE(recompute_softmax(m.program, {m.loss}) == 1);
  const int64_t batch = 8;
  const size_t before = Executor(stored, {m.loss}).plan(batch).peak_temporary_bytes;
  const size_t after = Executor(m.program, {m.loss}).plan(batch).peak_temporary_bytes;
  const size_t tokens = static_cast<size_t>(batch * tc.context);
  // At most the 2 bytes per element the logits are smaller than the softmax
  // (less where another tensor sets the peak), and more than half of that here.
  INFO("planned peak " << before << " -> " << after << " bytes");
  CHECK(after < before);
  CHECK(before - after <= 2 * tokens * static_cast<size_t>(tc.vocab));
  CHECK(before - after > tokens * static_cast<size_t>(tc.vocab));
}
