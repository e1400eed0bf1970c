#include "amp/unscale_pass.h"

#include <algorithm>
#include <map>
#include <set>

#include "amp/loss_scaler.h"
#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"

namespace mix::amp {

namespace {

// One group of gradients unscaled by one op: a bucket after its all-reduce.
struct UnscaleGroup {
  size_t after = 0;              // the op the unscale follows (the bucket's wait, or its last cast)
  std::vector<std::string> x;    // what is read: the reduced gradients
  std::vector<std::string> out;  // the FP32 gradients the update reads
  std::vector<size_t> casts;     // cast ops (to FP32) that the fused unscale replaces
};

bool is_gradient_sync(const OpDesc& op) {
  return (op.type == "c_allreduce_wait" || op.type == "c_allreduce_sum") &&
         op.attr<std::string>("traffic", "") == "gradients";
}

// The groups of the program's gradient buckets, in program order; empty when
// it has no gradient all-reduce. `param_of`: FP32 gradient -> parameter.
std::vector<UnscaleGroup> bucket_groups(const Program& p, const std::map<std::string, std::string>& param_of) {
  std::vector<UnscaleGroup> groups;
  for (size_t i = 0; i < p.ops().size(); ++i) {
    const OpDesc& op = p.ops()[i];
    if (!is_gradient_sync(op)) continue;
    UnscaleGroup g;
    g.after = i;
    const std::set<std::string> bucket(op.outs("Out").begin(), op.outs("Out").end());
    // The casts to FP32 that the all-reduce pass put right after an FP16 bucket's wait.
    std::set<std::string> cast_inputs;
    for (size_t j = i + 1; j < p.ops().size() && p.ops()[j].type == "cast" && bucket.count(p.ops()[j].in("X")); ++j) {
      g.casts.push_back(j);
      g.x.push_back(p.ops()[j].in("X"));
      g.out.push_back(p.ops()[j].out("Out"));
      cast_inputs.insert(p.ops()[j].in("X"));
      g.after = j;
    }
    for (auto& v : op.outs("Out"))
      if (!cast_inputs.count(v)) {
        g.x.push_back(v);
        g.out.push_back(v);
      }
    for (auto& v : g.out)
      MIX_CHECK(param_of.count(v), "gradient bucket " << op.attr<int64_t>("bucket", -1) << " holds " << v
                                                      << ", which is no parameter's FP32 gradient");
    groups.push_back(std::move(g));
  }
  return groups;
}

}  // namespace

LocalFoundInf insert_unscale(Program& p, const optim::ParamGrads& param_grads,
                             const std::optional<InjectOverflow>& inject) {
  std::map<std::string, std::string> param_of;  // FP32 gradient -> parameter
  for (auto& [param, grad] : param_grads) param_of[grad] = param;

  std::vector<UnscaleGroup> groups = bucket_groups(p, param_of);
  // No gradient all-reduce (a program without data parallelism): one group of everything, at the end.
  const bool bucketed = !groups.empty();
  if (!bucketed) {
    UnscaleGroup g;
    g.after = p.ops().size() - 1;
    for (auto& [param, grad] : param_grads) {
      g.x.push_back(grad);
      g.out.push_back(grad);
    }
    groups.push_back(std::move(g));
  }
  std::set<std::string> grouped;
  for (const UnscaleGroup& g : groups) grouped.insert(g.out.begin(), g.out.end());
  for (auto& [param, grad] : param_grads)
    MIX_CHECK(grouped.count(grad), "the gradient of " << param << " is in no all-reduced bucket, so nothing would "
                                                      "unscale it");
  if (inject && !inject->param.empty())
    MIX_CHECK(std::any_of(param_grads.begin(), param_grads.end(),
                          [&](auto& pg) { return pg.first == inject->param; }),
              "--inject-overflow names parameter '" << inject->param << "', which the model does not have");

  // Build each group's ops, then splice them in from the last group back, so
  // that the earlier positions stay valid.
  LocalFoundInf local;
  std::vector<std::vector<OpDesc>> group_ops(groups.size());
  for (size_t k = 0; k < groups.size(); ++k) {
    const UnscaleGroup& g = groups[k];
    const std::string flag = std::string(ScalerVars::found_inf) + (bucketed ? ".bucket" + std::to_string(k) : ".local");
    const std::string flag_each = flag + ".each";
    if (inject) {
      std::vector<std::string> targets;
      for (size_t i = 0; i < g.x.size(); ++i)
        if (inject->param.empty() || inject->param == param_of.at(g.out[i])) targets.push_back(g.x[i]);
      if (!targets.empty()) {
        OpDesc inj = make_op("inject_overflow", {{"X", targets}}, {{"Out", targets}},
                             {{"step", inject->step}, {"rank", static_cast<int64_t>(inject->rank)}});
        inj.role = OpRole::collective;
        group_ops[k].push_back(std::move(inj));
      }
    }
    OpDesc check = make_op(g.casts.empty() ? "check_finite_and_unscale" : "cast_check_finite_and_unscale",
                           {{"X", g.x}, {"Scale", {ScalerVars::scale}}},
                           {{"Out", g.out}, {"FoundInfinite", {flag}}, {"FoundInfiniteEach", {flag_each}}});
    check.role = OpRole::optimize;
    group_ops[k].push_back(std::move(check));
    local.flags.push_back(flag);
    local.each.push_back(flag_each);
    for (auto& v : g.out) local.params.push_back(param_of.at(v));
  }
  for (size_t k = groups.size(); k-- > 0;) {
    const UnscaleGroup& g = groups[k];
    size_t pos = g.after + 1;
    for (auto& op : group_ops[k]) p.insert_op(pos++, std::move(op));
    // The casts the fused op replaces (all before `pos`; erase from the back).
    for (size_t c = g.casts.size(); c-- > 0;) p.ops().erase(p.ops().begin() + static_cast<std::ptrdiff_t>(g.casts[c]));
  }
  return local;
}

void inject_loss_gradient_overflow(Program& p, const std::string& loss_grad, const InjectOverflow& inject) {
  MIX_CHECK(inject.micro_batch >= 0 && inject.param.empty(),
            "a micro-batch's overflow is injected into its loss gradient, every parameter's at once");
  const std::optional<size_t> seed = p.producer(loss_grad);
  MIX_CHECK(seed, "inject the overflow after " << loss_grad << " is seeded");
  OpDesc inj = make_op("inject_overflow", {{"X", {loss_grad}}}, {{"Out", {loss_grad}}},
                       {{"step", inject.step},
                        {"rank", static_cast<int64_t>(inject.rank)},
                        {"micro_batch", inject.micro_batch}});
  inj.role = OpRole::loss;
  p.insert_op(*seed + 1, std::move(inj));
}

void append_found_inf_allreduce(Program& p, const LocalFoundInf& local, int world_size) {
  // The global flag is the OR of the local ones, carried with the mask of
  // which ranks overflowed where.
  OpDesc sync_flag = make_op("c_allreduce_found_inf", {{"FoundInfinite", local.flags}, {"FoundInfiniteEach", local.each}},
                             {{"Out", {ScalerVars::found_inf}}, {"OverflowRanks", {ScalerVars::overflow_ranks}}},
                             {{"params", local.params}, {"world_size", static_cast<int64_t>(std::max(1, world_size))}});
  sync_flag.role = OpRole::collective;
  p.append_op(std::move(sync_flag));
}

}  // namespace mix::amp
