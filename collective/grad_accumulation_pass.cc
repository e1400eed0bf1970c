#include "collective/grad_accumulation_pass.h"

#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/grad_accumulate.h"

namespace mix::collective {

namespace {

bool is_gradient_start(const OpDesc& op) {
  return op.type == "c_allreduce_start" && op.attr<std::string>("traffic", "") == "gradients";
}

// The accumulators of a bucket's gradients, in the bucket's order.
std::vector<std::string> accumulators_of(const std::vector<std::string>& grads) {
  std::vector<std::string> accs;
  for (const std::string& g : grads) accs.push_back(grad_accumulator_name(g));
  return accs;
}

OpDesc accumulate_op(const std::vector<std::string>& grads, const char* mode) {
  const std::vector<std::string> accs = accumulators_of(grads);
  std::map<std::string, std::vector<std::string>> outs{{"AccumOut", accs}};
  if (std::string(mode) == "finish") outs["Out"] = grads;
  OpDesc op = make_op("grad_accumulate", {{"X", grads}, {"Accum", accs}}, outs, {{"mode", std::string(mode)}});
  op.role = OpRole::backward;
  return op;
}

}  // namespace

int insert_grad_accumulation(Program& p) {
  int grads = 0;
  for (size_t i = 0; i < p.ops().size(); ++i) {
    if (!is_gradient_start(p.ops()[i])) continue;
    const std::vector<std::string> bucket = p.ops()[i].ins("X");
    for (const std::string& g : bucket) {
      VarDesc acc{grad_accumulator_name(g), p.var(g).shape, DType::f32, true, false, true, {VarInit::Kind::zeros, 0}};
      MIX_CHECK(!p.has_var(acc.name), "gradient " << g << " is in two buckets");
      MIX_CHECK(shape_numel(acc.shape) >= 0, "gradient " << g << " has an unknown size " << shape_str(acc.shape));
      p.add_var(acc);
    }
    p.insert_op(i, accumulate_op(bucket, "finish"));
    ++i;  // past the start
    grads += static_cast<int>(bucket.size());
  }
  MIX_CHECK(grads > 0, "gradient accumulation needs the gradient all-reduce pass first (no gradient bucket found)");
  return grads;
}

Program micro_batch_program(const Program& step) {
  Program micro = step;
  std::vector<OpDesc> ops;
  for (const OpDesc& op : step.ops()) {
    // The step's "finish" of a bucket becomes an "add" of the same gradients
    // (found by the finish, not the start after it, which one rank's program
    // no longer has: collective/elide_single_rank_sync.h).
    if (op.type == "grad_accumulate") {
      ops.push_back(accumulate_op(op.ins("X"), "add"));
      continue;
    }
    if (op.role == OpRole::forward || op.role == OpRole::loss || op.role == OpRole::backward) ops.push_back(op);
  }
  micro.ops() = std::move(ops);
  return micro;
}

}  // namespace mix::collective
