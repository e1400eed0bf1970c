// elide_single_rank_sync (collective/elide_single_rank_sync.h): on one rank
// the gradient all-reduces leave the program after the passes that place the
// unscale and the accumulation by them; only identity pairs go; the
// micro-batches' program is the same with or without them; training gives
// the same bits with them and without, and the packed Buffers no longer take
// memory. Whole runs (grad_bytes, --grad-accum-steps): e2e.test_single_rank_sync.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "collective/elide_single_rank_sync.h"
#include "models/model.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/op_registry.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/gradcheck.h"
#include "tests/unit/train_steps.h"

using namespace mix;
using namespace mix::testing;

namespace {

const launch::PassRun& elision(const launch::TrainProgram& t) { return pass_named(t, "elide_single_rank_sync"); }

// The MLP's program for `world` ranks, its gradients in several buckets.
struct MlpProgram {
  models::Model m = models::build_mlp({16, {8, 8}, 3});
  launch::TrainProgram t;
  MlpProgram(amp::Precision precision, int world, bool elide, int64_t accumulate = 1, double predivide = 0) {
    launch::TrainProgramOptions o;
    o.precision = precision;
    o.grad_sync->world_size = world;
    o.grad_sync->bucket_bytes = 256;
    o.grad_sync->predivide = predivide;
    o.passes.elide_single_rank_sync = elide;
    o.grad_accum_steps = accumulate;
    t = launch::build_train_program(m.program, m.loss, o);
  }
};

// The ops' types and slots, one string each, for comparing two programs.
std::vector<std::string> op_lines(const Program& p) {
  std::vector<std::string> lines;
  for (const OpDesc& op : p.ops()) {
    std::string line = op.type;
    for (const auto& names : {op.all_inputs(), op.all_outputs()})
      for (const std::string& n : names) line += " " + n;
    lines.push_back(line);
  }
  return lines;
}

}  // namespace

TEST_CASE("elide_single_rank_sync takes every gradient all-reduce out of one rank's program, and only those",
          "[single_rank_sync]") {
  for (const auto precision : {amp::Precision::amp, amp::Precision::bf16, amp::Precision::fp32}) {
    INFO(amp::to_string(precision));
    MlpProgram kept(precision, 1, false), elided(precision, 1, true);
    const int buckets = static_cast<int>(kept.t.buckets.size());
    REQUIRE(buckets > 1);
    CHECK(count_ops(kept.m.program, "c_allreduce_start") == buckets);
    CHECK(count_ops(kept.m.program, "c_allreduce_wait") == buckets);
    CHECK(elision(kept.t).off_by == "--no-elide-single-rank-sync");
    CHECK(elision(elided.t).ran);
    CHECK(elision(elided.t).result == std::to_string(buckets) + " buckets' all-reduces");
    CHECK(count_ops(elided.m.program, "c_allreduce_start") == 0);
    CHECK(count_ops(elided.m.program, "c_allreduce_wait") == 0);
    // The rest is the same program, the unscale and the found_inf all-reduce included.
    std::vector<std::string> rest;
    for (const std::string& line : op_lines(kept.m.program))
      if (line.rfind("c_allreduce_start ", 0) != 0 && line.rfind("c_allreduce_wait ", 0) != 0) rest.push_back(line);
    CHECK(op_lines(elided.m.program) == rest);
    if (precision != amp::Precision::fp32) {
      CHECK(count_ops(elided.m.program, "c_allreduce_found_inf") == 1);
      // Each bucket's unscale, placed after its wait, stays where it was put.
      CHECK(count_ops(elided.m.program, "check_finite_and_unscale") +
                count_ops(elided.m.program, "cast_check_finite_and_unscale") ==
            buckets);
    }
    // The packed Buffers were temporaries of the step; they are gone from its
    // plan. They set its peak where FP32 buckets travel; under AMP the peak
    // comes later, when the unscale writes the FP32 gradients beside the FP16.
    const size_t kept_peak = Executor(kept.m.program, kept.t.read_back).plan(4).peak_temporary_bytes;
    const size_t elided_peak = Executor(elided.m.program, elided.t.read_back).plan(4).peak_temporary_bytes;
    if (precision == amp::Precision::amp)
      CHECK(elided_peak <= kept_peak);
    else
      CHECK(elided_peak < kept_peak);
  }
}

TEST_CASE("elide_single_rank_sync leaves the all-reduces of several ranks, and pairs that are not the identity",
          "[single_rank_sync]") {
  MlpProgram two(amp::Precision::amp, 2, true);
  CHECK_FALSE(elision(two.t).ran);
  CHECK(elision(two.t).off_by == "2 ranks");
  CHECK(count_ops(two.m.program, "c_allreduce_start") == static_cast<int>(two.t.buckets.size()));

  // --grad-predivide 2 on one rank: times 1/2 before, times 2 after, each rounded.
  MlpProgram predivided(amp::Precision::amp, 1, true, 1, 2.0);
  CHECK(elision(predivided.t).ran);
  CHECK(elision(predivided.t).result == "0 buckets' all-reduces");
  CHECK(count_ops(predivided.m.program, "c_allreduce_start") == static_cast<int>(predivided.t.buckets.size()));

  launch::TrainProgramOptions none;
  none.grad_sync.reset();
  models::Model m = models::build_mlp({16, {8}, 3});
  CHECK(elision(launch::build_train_program(m.program, m.loss, none)).off_by == "no data-parallel pass");

  // By hand: a control all-reduce, and a wait writing elsewhere than the bucket.
  Program p;
  for (const char* name : {"g", "h"}) p.add_var(var_desc(name, {4}, DType::f32));
  p.append_op(make_op("c_allreduce_start", {{"X", {"g"}}}, {{"Buffer", {"b"}}}, {{"traffic", std::string("control")}}));
  p.append_op(
      make_op("c_allreduce_wait", {{"Buffer", {"b"}}}, {{"Out", {"g"}}}, {{"traffic", std::string("control")}}));
  p.append_op(
      make_op("c_allreduce_start", {{"X", {"g"}}}, {{"Buffer", {"b2"}}}, {{"traffic", std::string("gradients")}}));
  p.append_op(
      make_op("c_allreduce_wait", {{"Buffer", {"b2"}}}, {{"Out", {"h"}}}, {{"traffic", std::string("gradients")}}));
  CHECK(collective::elide_single_rank_sync(p) == 0);
  CHECK(p.ops().size() == 4);
}

TEST_CASE("with one rank's sync elided, accumulation keeps its finishes and the micro-batches' program is the same",
          "[single_rank_sync][grad_accum]") {
  for (const auto precision : {amp::Precision::amp, amp::Precision::fp32}) {
    INFO(amp::to_string(precision));
    MlpProgram kept(precision, 1, false, 3), elided(precision, 1, true, 3);
    REQUIRE(kept.t.micro_batch_program);
    REQUIRE(elided.t.micro_batch_program);
    CHECK(op_lines(*elided.t.micro_batch_program) == op_lines(*kept.t.micro_batch_program));
    CHECK(count_ops(*elided.t.micro_batch_program, "grad_accumulate") == static_cast<int>(kept.t.buckets.size()));
    CHECK(count_ops(elided.m.program, "grad_accumulate") == static_cast<int>(kept.t.buckets.size()));
    CHECK(count_ops(elided.m.program, "c_allreduce_start") == 0);
  }
}

TEST_CASE("training one rank without its all-reduces gives the bits of training with them", "[single_rank_sync]") {
  struct Case {
    bool amp;
    DType low;
    bool tied, overlap;
  };
  for (const Case& c : {Case{false, DType::f16, false, true}, Case{true, DType::f16, true, true},
                        Case{true, DType::f16, true, false}, Case{true, DType::bf16, true, true}}) {
    INFO((c.amp ? "AMP " + dname(c.low) : std::string("FP32"))
         << (c.tied ? ", tied" : "") << (c.overlap ? "" : ", no overlap"));
    // Small buckets: several gradients packed into each, FP16/BF16 and FP32 ones.
    TrainOptions o{.amp = c.amp, .low = c.low, .bucket_bytes = 4096, .overlap = c.overlap, .steps = 3, .batch = 2};
    TrainedModel elided = train_steps(tiny_gpt_model(c.tied), o);
    o.elide_single_rank_sync = false;
    TrainedModel kept = train_steps(tiny_gpt_model(c.tied), o);
    CHECK(count_ops(elided.model.program, "c_allreduce_wait") == 0);
    CHECK(count_ops(kept.model.program, "c_allreduce_wait") == static_cast<int>(kept.train.buckets.size()));
    CHECK(kept.train.buckets.size() > 2);
    expect_same_training(elided, kept);
  }
}
