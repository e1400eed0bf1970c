// launch/train_program.cc, the one pipeline that builds every training
// program: its passes run in the order of the AMP step, --print-program's list
// says which ran and which flag or setting turned each other one off, and the
// cross-flag rules it owns (the reduction dtype, an FP32 loss) are refused
// with messages that say what to change.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "launch/train_program.h"
#include "launch/worker_main.h"
#include "models/model.h"
#include "runtime/ir/op_registry.h"
#include "tests/unit/train_steps.h"

using namespace mix;
using launch::PassRun;
using launch::TrainProgramOptions;
using testing::pass_named;

namespace {

models::Model resnet() {
  models::ResNetConfig c = models::resnet_preset("resnet-small");
  c.width = 4;
  c.blocks = {1, 1};
  c.image_size = 8;
  return models::build_resnet(c, "resnet-small");
}

// The names' positions in the pipeline, in the order given.
std::vector<size_t> positions(const launch::TrainProgram& t, const std::vector<std::string>& prefixes) {
  std::vector<size_t> at;
  for (const std::string& prefix : prefixes)
    for (size_t i = 0; i < t.passes.size(); ++i)
      if (t.passes[i].name.rfind(prefix, 0) == 0) at.push_back(i);
  return at;
}

const std::vector<std::string> kStepOrder = {"amp::rewrite",
                                             "amp::fold_widening_casts",
                                             "amp::fold_casts_into_producers",
                                             "seed_loss_gradient",
                                             "append_backward",
                                             "amp::fold_widening_grad_casts",
                                             "insert_grad_allreduce",
                                             "insert_grad_accumulation",
                                             "amp::insert_unscale",
                                             "amp::append_found_inf_allreduce",
                                             "grad_global_norm",
                                             "clip_by_global_norm",
                                             "clip_by_value",
                                             "amp::append_update_loss_scaling",
                                             "any_flag",
                                             "optimizer",
                                             "recompute_softmax",
                                             "fuse_add_relu",
                                             "amp::fuse_param_casts",
                                             "fuse_matmul_bias",
                                             "fuse_bn_relu",
                                             "fold_grad_sums",
                                             "fuse_add_layer_norm",
                                             "elide_single_rank_sync"};

}  // namespace

TEST_CASE("the pipeline runs the AMP step's passes in order, each once", "[train_program]") {
  models::Model m = resnet();
  const launch::TrainProgram t = launch::build_train_program(m.program, m.loss, TrainProgramOptions{});
  REQUIRE(t.passes.size() == kStepOrder.size());
  const std::vector<size_t> at = positions(t, kStepOrder);
  REQUIRE(at.size() == kStepOrder.size());
  for (size_t i = 0; i < at.size(); ++i) CHECK(at[i] == i);
  for (const PassRun& p : t.passes) {
    INFO(p.name);
    // Off by default: accumulation (one micro-batch a step) and the clips.
    const bool accumulation = p.name.rfind("insert_grad_accumulation", 0) == 0;
    const bool clip = p.name.rfind("clip_by_", 0) == 0 || p.name.rfind("any_flag", 0) == 0;  // and outlier skips
    CHECK(p.ran != (accumulation || clip));
    if (accumulation) CHECK(p.off_by == "--grad-accum-steps 1");
    if (clip) CHECK(p.off_by.rfind("no --", 0) == 0);
    if (!accumulation && !clip) CHECK(p.off_by.empty());
  }
  // What they did, on a ResNet under AMP: the fusions all find their pairs.
  CHECK(pass_named(t, "fuse_add_relu").changed);
  CHECK(pass_named(t, "fuse_bn_relu").changed);
  CHECK(pass_named(t, "amp::fuse_param_casts").changed);
  CHECK(pass_named(t, "insert_grad_allreduce").result ==
        std::to_string(t.buckets.size()) + (t.buckets.size() == 1 ? " bucket" : " buckets"));
  CHECK(t.found_inf == "found_inf");
  CHECK(t.read_back.count(m.loss));
  CHECK(t.read_back.count("found_inf.ranks"));
  // The program holds what the passes say: the scaler's update, the fused ops.
  int updates = 0, fused_casts = 0;
  for (const OpDesc& op : m.program.ops()) {
    updates += op.type == "update_loss_scaling";
    fused_casts += op.type == "fused_cast";
  }
  CHECK(updates == 1);
  CHECK(fused_casts == 1);

  const std::string listed = t.describe_passes();
  CHECK(listed.rfind("passes, in order", 0) == 0);
  CHECK_THAT(listed, Catch::Contains("  1. amp::rewrite") && Catch::Contains("(amp/rewrite.cc)") &&
                         Catch::Contains("  21. fuse_bn_relu"));
}

TEST_CASE("in FP32 the AMP passes are off, and the list says why", "[train_program]") {
  models::Model m = resnet();
  TrainProgramOptions o;
  o.precision = amp::Precision::fp32;
  const launch::TrainProgram t = launch::build_train_program(m.program, m.loss, o);
  for (const std::string amp_pass :
       {"amp::rewrite", "amp::fold_widening_casts", "amp::fold_casts_into_producers", "amp::fold_widening_grad_casts",
        "amp::insert_unscale", "amp::append_found_inf_allreduce", "amp::append_update_loss_scaling",
        "amp::fuse_param_casts"}) {
    INFO(amp_pass);
    CHECK_FALSE(pass_named(t, amp_pass).ran);
    CHECK(pass_named(t, amp_pass).off_by == "--precision fp32");
  }
  for (const std::string step : {"seed_loss_gradient", "append_backward", "insert_grad_allreduce", "optimizer",
                                 "recompute_softmax", "fuse_add_relu", "fuse_matmul_bias", "fuse_bn_relu",
                                 "fold_grad_sums", "fuse_add_layer_norm", "elide_single_rank_sync"})
    CHECK(pass_named(t, step).ran);
  CHECK(pass_named(t, "insert_grad_allreduce").name == "insert_grad_allreduce: gradient all-reduce in fp32");
  CHECK(t.found_inf.empty());
  for (const OpDesc& op : m.program.ops()) {
    INFO(op.type);
    CHECK(op.type != "cast");
    CHECK(op.type != "update_loss_scaling");
  }
  CHECK_THAT(t.describe_passes(), Catch::Contains("amp::rewrite: casts by the AMP lists (amp/rewrite.cc): off, "
                                                  "--precision fp32"));
}

TEST_CASE("each flag that turns a pass off is named in the list, and the pass leaves the program alone",
          "[train_program]") {
  models::Model on = resnet(), off = resnet();
  const launch::TrainProgram t_on = launch::build_train_program(on.program, on.loss, TrainProgramOptions{});
  TrainProgramOptions o;
  o.amp.fold_casts = false;
  o.passes = launch::StepPasses::none();
  const launch::TrainProgram t = launch::build_train_program(off.program, off.loss, o);
  CHECK(pass_named(t, "amp::fold_widening_casts").off_by == "--no-fold-casts");
  CHECK(pass_named(t, "amp::fold_widening_grad_casts").off_by == "--no-fold-casts");
  CHECK(pass_named(t, "amp::fold_casts_into_producers").off_by == "--no-fold-casts");
  CHECK(pass_named(t, "recompute_softmax").off_by == "--store-softmax");
  CHECK(pass_named(t, "fuse_add_relu").off_by == "--no-fuse-add-relu");
  CHECK(pass_named(t, "fuse_matmul_bias").off_by == "--no-fuse-matmul-bias");
  CHECK(pass_named(t, "amp::fuse_param_casts").off_by == "--no-fuse-param-casts");
  CHECK(pass_named(t, "fuse_bn_relu").off_by == "--no-fuse-bn-relu");
  CHECK(pass_named(t, "fold_grad_sums").off_by == "--no-fold-grad-sums");
  CHECK(pass_named(t, "fuse_add_layer_norm").off_by == "--no-fuse-add-layer-norm");
  CHECK(pass_named(t, "elide_single_rank_sync").off_by == "--no-elide-single-rank-sync");
  // The ops they would have fused are still there, and more of them.
  auto count = [](const Program& p, const std::string& type) {
    int n = 0;
    for (const OpDesc& op : p.ops()) n += op.type == type;
    return n;
  };
  CHECK(count(off.program, "relu") > count(on.program, "relu"));
  CHECK(count(off.program, "fused_cast") == 0);
  CHECK(count(on.program, "fused_cast") == 1);
  CHECK(t_on.passes.size() == t.passes.size());
}

TEST_CASE("without a data-parallel pass the unscale runs once, after backward", "[train_program]") {
  models::Model m = models::build_mlp({16, {8}, 3});
  TrainProgramOptions o;
  o.grad_sync.reset();
  const launch::TrainProgram t = launch::build_train_program(m.program, m.loss, o);
  CHECK(pass_named(t, "insert_grad_allreduce").off_by == "no data-parallel pass");
  CHECK(pass_named(t, "amp::insert_unscale").result == "1 unscale op");
  CHECK(t.buckets.empty());
  for (const OpDesc& op : m.program.ops()) CHECK(op.type.rfind("c_allreduce_start", 0) != 0);
  // The optimizer reads autodiff's gradients, unscaled in place.
  CHECK(t.param_grads == t.backward_grads);
}

TEST_CASE("the reduction dtype follows the precision, and an FP16 reduction of FP32 training is refused",
          "[train_program]") {
  CHECK(launch::default_grad_reduce(amp::Precision::amp) == collective::GradReduce::fp16);
  CHECK(launch::default_grad_reduce(amp::Precision::fp32) == collective::GradReduce::fp32);
  CHECK(launch::grad_reduce_conflict(amp::Precision::amp, collective::GradReduce::fp16).empty());
  CHECK(launch::grad_reduce_conflict(amp::Precision::amp, collective::GradReduce::fp32).empty());
  CHECK(launch::grad_reduce_conflict(amp::Precision::fp32, collective::GradReduce::fp32).empty());
  CHECK_THAT(launch::grad_reduce_conflict(amp::Precision::fp32, collective::GradReduce::fp16),
             Catch::Contains("--grad-reduce fp16 needs --precision amp"));

  models::Model m = models::build_mlp({16, {8}, 3});
  TrainProgramOptions o;
  o.precision = amp::Precision::fp32;
  o.grad_reduce = collective::GradReduce::fp16;
  CHECK_THROWS_AS(launch::build_train_program(m.program, m.loss, o), launch::UsageError);
  // AMP reducing in FP32: the cast stays in backward and FP32 travels.
  models::Model a = models::build_mlp({16, {8}, 3});
  TrainProgramOptions amp32;
  amp32.grad_reduce = collective::GradReduce::fp32;
  const launch::TrainProgram t = launch::build_train_program(a.program, a.loss, amp32);
  for (const auto& b : t.buckets) CHECK(b.dtype == DType::f32);
}

TEST_CASE("an AMP list that puts the loss in FP16 is refused, naming the flag to change", "[train_program]") {
  models::Model m = models::build_mlp({16, {8}, 3});
  TrainProgramOptions o;
  o.amp.custom_white = {"mean"};  // the MLP's loss is the mean of the cross-entropy
  try {
    launch::build_train_program(m.program, m.loss, o);
    FAIL("no error for an FP16 loss");
  } catch (const launch::UsageError& e) {
    CHECK_THAT(e.what(), Catch::Contains("--amp-white-list mean computes the loss") &&
                             Catch::Contains("take mean off --amp-white-list"));
  }
}
