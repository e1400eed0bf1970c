// Gradient accumulation's parts: the grad_accumulate op (runtime/ops/
// grad_accumulate.cc) holds the sum in FP32 and rounds it to the gradient's
// dtype once; insert_grad_accumulation puts a "finish" right before each
// gradient bucket's all-reduce; micro_batch_program keeps the step's forward
// and backward and nothing after, each bucket's start an "add"; the loss
// gradient is seeded with 1/K. Whole runs: e2e.test_grad_accum.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "collective/grad_accumulation_pass.h"
#include "launch/train_program.h"
#include "models/model.h"
#include "runtime/core/half.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/grad_accumulate.h"

using namespace mix;

namespace {

// A program of one grad_accumulate over `x` (FP16 [n]) and its FP32 accumulator.
struct AccumulateOp {
  Program p;
  Scope scope;
  ExecEnv env;

  AccumulateOp(const char* mode, int64_t n) {
    p.add_var(VarDesc{"x", {n}, DType::f16, false, false, false, {}});
    p.add_var(VarDesc{grad_accumulator_name("x"), {n}, DType::f32, true, false, true, {}});
    std::map<std::string, std::vector<std::string>> outs{{"AccumOut", {grad_accumulator_name("x")}}};
    if (std::string(mode) == "finish") outs["Out"] = {"x"};
    p.append_op(make_op("grad_accumulate", {{"X", {"x"}}, {"Accum", {grad_accumulator_name("x")}}}, outs,
                        {{"mode", std::string(mode)}}));
  }
  void run(const std::vector<float>& x, std::vector<float>& acc) {
    Tensor xt = Tensor::empty({static_cast<int64_t>(x.size())}, DType::f16);
    for (size_t i = 0; i < x.size(); ++i) xt.data<half_t>()[i] = to_half(x[i]);
    scope.set("x", xt);
    scope.set(grad_accumulator_name("x"), Tensor::from_floats({static_cast<int64_t>(acc.size())}, acc));
    Executor(p, {"x", grad_accumulator_name("x")}).run(scope, env);
    acc = scope.get(grad_accumulator_name("x")).to_floats();
  }
  std::vector<float> x() const { return scope.get("x").to_floats(); }
};

size_t count_ops(const Program& p, const std::string& type) {
  size_t n = 0;
  for (const OpDesc& op : p.ops()) n += op.type == type;
  return n;
}

}  // namespace

TEST_CASE("grad_accumulate sums in FP32 and rounds to the gradient's dtype once", "[grad_accum]") {
  // 2048 + 1 + 1 in FP16 one add at a time stays 2048 (the spacing there is 2,
  // and each 1 is a tie that rounds to even); in FP32 it is 2050, which FP16 holds.
  std::vector<float> acc = {0.f, 0.f, 0.f};
  AccumulateOp add("add", 3);
  add.run({2048.f, 0.5f, INFINITY}, acc);
  add.run({1.f, 0.25f, 1.f}, acc);
  CHECK(acc == std::vector<float>{2049.f, 0.75f, INFINITY});
  CHECK(add.x() == std::vector<float>{1.f, 0.25f, 1.f});  // "add" leaves X alone

  AccumulateOp finish("finish", 3);
  finish.run({1.f, 0.125f, 2.f}, acc);
  CHECK(finish.x() == std::vector<float>{2050.f, 0.875f, INFINITY});  // an inf of any micro-batch survives
  CHECK(acc == std::vector<float>{0.f, 0.f, 0.f});                     // ready for the next step
  // The same three in FP16 one add at a time would have lost the two 1s.
  CHECK(round_to_half(round_to_half(2048.f + 1.f) + 1.f) == 2048.f);
}

TEST_CASE("grad_accumulate refuses a mode it does not know and accumulators that do not match", "[grad_accum]") {
  Program p;
  p.add_var(VarDesc{"x", {4}, DType::f16, false, false, false, {}});
  p.add_var(VarDesc{"acc", {4}, DType::f16, true, false, true, {}});
  CHECK_THROWS_WITH(p.append_op(make_op("grad_accumulate", {{"X", {"x"}}, {"Accum", {"acc"}}},
                                        {{"AccumOut", {"acc"}}}, {{"mode", std::string("sum")}})),
                    Catch::Contains("mode must be add or finish"));
  CHECK_THROWS_WITH(p.append_op(make_op("grad_accumulate", {{"X", {"x"}}, {"Accum", {"acc"}}},
                                        {{"AccumOut", {"acc"}}}, {{"mode", std::string("add")}})),
                    Catch::Contains("must be FP32"));
}

TEST_CASE("with K micro-batches the step's program accumulates before each all-reduce, and the micro-batches' "
          "program stops after backward",
          "[grad_accum]") {
  for (const auto precision : {amp::Precision::amp, amp::Precision::fp32}) {
    INFO(amp::to_string(precision));
    models::Model m = models::build_mlp({16, {8}, 3});
    launch::TrainProgramOptions o;
    o.precision = precision;
    o.grad_accum_steps = 4;
    o.grad_sync->bucket_bytes = 64;  // several buckets
    o.grad_sync->world_size = 2;     // all-reduces that stay (one rank's are elided)
    const launch::TrainProgram t = launch::build_train_program(m.program, m.loss, o);
    REQUIRE(t.micro_batch_program);
    CHECK(t.grad_accum_steps == 4);

    // The step: one "finish" right before each gradient bucket's start, over its tensors.
    const auto& ops = m.program.ops();
    size_t starts = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].type != "c_allreduce_start") continue;
      ++starts;
      REQUIRE(i > 0);
      CHECK(ops[i - 1].type == "grad_accumulate");
      CHECK(ops[i - 1].attr<std::string>("mode", "") == "finish");
      CHECK(ops[i - 1].ins("X") == ops[i].ins("X"));
    }
    CHECK(starts > 1);
    CHECK(count_ops(m.program, "grad_accumulate") == starts);
    // Accumulators: FP32, persistable, one per gradient the buckets send.
    for (const auto& b : t.buckets)
      for (const std::string& g : b.vars) {
        const VarDesc& acc = m.program.var(grad_accumulator_name(g));
        CHECK(acc.dtype == DType::f32);
        CHECK(acc.persistable);
      }
    // Each loss counts 1/K.
    for (const OpDesc& op : ops)
      if (op.role == OpRole::loss && op.out_or_empty("Out") == m.loss + "@GRAD")
        CHECK(op.attr<double>(precision == amp::Precision::amp ? "multiplier" : "value", 1.0) == 0.25);

    // The micro-batches': the same forward and backward, no all-reduce, unscale, scaler or update.
    const Program& micro = *t.micro_batch_program;
    CHECK(count_ops(micro, "grad_accumulate") == starts);
    for (const OpDesc& op : micro.ops()) {
      INFO(op.type);
      CHECK(op.type.rfind("c_allreduce", 0) != 0);
      CHECK(op.role != OpRole::optimize);
      if (op.type == "grad_accumulate") CHECK(op.attr<std::string>("mode", "") == "add");
    }
    size_t step_fwd_bwd = 0, micro_fwd_bwd = 0;
    for (const OpDesc& op : ops) step_fwd_bwd += op.role != OpRole::collective && op.role != OpRole::optimize;
    for (const OpDesc& op : micro.ops()) micro_fwd_bwd += op.role != OpRole::collective && op.role != OpRole::optimize;
    CHECK(micro_fwd_bwd == step_fwd_bwd);  // the finishes became the adds, one for one
  }
}

TEST_CASE("accumulation needs the data-parallel pass, whose buckets it follows", "[grad_accum]") {
  models::Model m = models::build_mlp({16, {8}, 3});
  launch::TrainProgramOptions o;
  o.grad_accum_steps = 2;
  o.grad_sync.reset();
  CHECK_THROWS_WITH(launch::build_train_program(m.program, m.loss, o), Catch::Contains("data-parallel pass"));
}
