#include "amp/decorate.h"

#include <algorithm>
#include <map>
#include <set>

#include "amp/fold_casts.h"
#include "amp/rewrite.h"
#include "runtime/core/check.h"
#include "runtime/ir/autodiff.h"
#include "runtime/ir/op_registry.h"

namespace mix::amp {

namespace {

class Decorated final : public optim::Optimizer {
 public:
  Decorated(std::unique_ptr<optim::Optimizer> inner, AmpOptions o) : inner_(std::move(inner)), o_(std::move(o)) {}
  std::string name() const override { return "amp(" + inner_->name() + ")"; }
  void set_no_decay_1d(bool on) override { inner_->set_no_decay_1d(on); }

  optim::TrainProgram minimize(Program& p, const std::string& loss, const optim::GradSyncPass& sync) override {
    rewrite(p, o_.lists, o_.low_dtype);
    if (o_.fold_casts) fold_widening_casts(p);
    declare_scaler_state(p, o_.scaler);
    seed_loss_gradient(p, loss, ScalerVars::scale);
    BackwardResult bw = append_backward(p, loss);
    if (o_.fold_casts) fold_widening_grad_casts(p);
    optim::TrainProgram t;
    t.loss = loss;
    t.param_grads = sync ? sync(p, bw.param_grads) : bw.param_grads;
    t.found_inf = ScalerVars::found_inf;

    insert_unscale_and_found_inf(p, t.param_grads);

    const LossScalerConfig& c = o_.scaler;
    validate(c);
    OpDesc update = make_op(
        "update_loss_scaling",
        {{"FoundInfinite", {ScalerVars::found_inf}},
         {"PrevLossScaling", {ScalerVars::scale}},
         {"InGoodSteps", {ScalerVars::good_steps}},
         {"InBadSteps", {ScalerVars::bad_steps}},
         {"Skipped", {ScalerVars::skipped}},
         {"ConsecutiveSkipsAtMin", {ScalerVars::skips_at_min}}},
        {{"LossScaling", {ScalerVars::scale}},
         {"OutGoodSteps", {ScalerVars::good_steps}},
         {"OutBadSteps", {ScalerVars::bad_steps}},
         {"OutSkipped", {ScalerVars::skipped}},
         {"OutConsecutiveSkipsAtMin", {ScalerVars::skips_at_min}}},
        to_op_attrs(c));
    update.role = OpRole::optimize;
    p.append_op(std::move(update));

    inner_->append_update_ops(p, t.param_grads, ScalerVars::found_inf);
    return t;
  }

  void append_update_ops(Program& p, const optim::ParamGrads& g, const std::string& skip) override {
    inner_->append_update_ops(p, g, skip);
  }

 private:
  // One group of gradients unscaled by one op: a bucket after its all-reduce.
  struct UnscaleGroup {
    size_t after = 0;                // the op the unscale follows (the bucket's wait)
    std::vector<std::string> x;      // what is read: the reduced gradients
    std::vector<std::string> out;    // the FP32 gradients the update reads
    std::vector<size_t> casts;       // cast ops (to FP32) that the fused unscale replaces
  };

  // Step 5 and 6 of DESIGN.md's AMP step: check_finite_and_unscale per
  // gradient bucket, right after the bucket's wait (the sync pass put the
  // bucket's casts to FP32 there; they fuse into cast_check_finite_and_unscale),
  // then one c_allreduce_found_inf of every bucket's flags.
  void insert_unscale_and_found_inf(Program& p, const optim::ParamGrads& param_grads) const {
    std::map<std::string, std::string> param_of;  // FP32 gradient -> parameter
    for (auto& [param, grad] : param_grads) param_of[grad] = param;

    std::vector<UnscaleGroup> groups;
    std::set<std::string> grouped;
    for (size_t i = 0; i < p.ops().size(); ++i) {
      const OpDesc& op = p.ops()[i];
      const bool gradient_sync = (op.type == "c_allreduce_wait" || op.type == "c_allreduce_sum") &&
                                 op.attr<std::string>("traffic", "") == "gradients";
      if (!gradient_sync) continue;
      UnscaleGroup g;
      g.after = i;
      const std::set<std::string> bucket(op.outs("Out").begin(), op.outs("Out").end());
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
      for (auto& v : g.out) {
        MIX_CHECK(param_of.count(v), "gradient bucket " << op.attr<int64_t>("bucket", -1) << " holds " << v
                                                        << ", which is no parameter's FP32 gradient");
        grouped.insert(v);
      }
      groups.push_back(std::move(g));
    }
    // No sync pass (a caller without data parallelism): one group of everything, at the end.
    const bool bucketed = !groups.empty();
    if (!bucketed) {
      UnscaleGroup g;
      g.after = p.ops().size() - 1;
      for (auto& [param, grad] : param_grads) {
        g.x.push_back(grad);
        g.out.push_back(grad);
        grouped.insert(grad);
      }
      groups.push_back(std::move(g));
    }
    for (auto& [param, grad] : param_grads)
      MIX_CHECK(grouped.count(grad), "the gradient of " << param << " is in no all-reduced bucket, so nothing would "
                                                        "unscale it");
    if (o_.inject && !o_.inject->param.empty())
      MIX_CHECK(std::any_of(param_grads.begin(), param_grads.end(),
                            [&](auto& pg) { return pg.first == o_.inject->param; }),
                "--inject-overflow names parameter '" << o_.inject->param << "', which the model does not have");

    // Build each group's ops, then splice them in from the last group back, so
    // that the earlier positions stay valid.
    std::vector<std::string> flags, each, params;
    std::vector<std::vector<OpDesc>> group_ops(groups.size());
    for (size_t k = 0; k < groups.size(); ++k) {
      const UnscaleGroup& g = groups[k];
      const std::string flag = std::string(ScalerVars::found_inf) + (bucketed ? ".bucket" + std::to_string(k) : ".local");
      const std::string flag_each = flag + ".each";
      if (o_.inject) {
        std::vector<std::string> targets;
        for (size_t i = 0; i < g.x.size(); ++i)
          if (o_.inject->param.empty() || o_.inject->param == param_of.at(g.out[i])) targets.push_back(g.x[i]);
        if (!targets.empty()) {
          OpDesc inj = make_op("inject_overflow", {{"X", targets}}, {{"Out", targets}},
                               {{"step", o_.inject->step}, {"rank", static_cast<int64_t>(o_.inject->rank)}});
          inj.role = OpRole::collective;
          group_ops[k].push_back(std::move(inj));
        }
      }
      OpDesc check = make_op(g.casts.empty() ? "check_finite_and_unscale" : "cast_check_finite_and_unscale",
                             {{"X", g.x}, {"Scale", {ScalerVars::scale}}},
                             {{"Out", g.out}, {"FoundInfinite", {flag}}, {"FoundInfiniteEach", {flag_each}}});
      check.role = OpRole::optimize;
      group_ops[k].push_back(std::move(check));
      flags.push_back(flag);
      each.push_back(flag_each);
      for (auto& v : g.out) params.push_back(param_of.at(v));
    }
    for (size_t k = groups.size(); k-- > 0;) {
      const UnscaleGroup& g = groups[k];
      size_t pos = g.after + 1;
      for (auto& op : group_ops[k]) p.insert_op(pos++, std::move(op));
      // The casts the fused op replaces (all before `pos`; erase from the back).
      for (size_t c = g.casts.size(); c-- > 0;) p.ops().erase(p.ops().begin() + static_cast<std::ptrdiff_t>(g.casts[c]));
    }

    // Every rank takes the same decision: the global flag is the OR of the
    // local ones, carried with the mask of which ranks overflowed where.
    OpDesc sync_flag = make_op("c_allreduce_found_inf", {{"FoundInfinite", flags}, {"FoundInfiniteEach", each}},
                               {{"Out", {ScalerVars::found_inf}}, {"OverflowRanks", {ScalerVars::overflow_ranks}}},
                               {{"params", params}, {"world_size", static_cast<int64_t>(std::max(1, o_.world_size))}});
    sync_flag.role = OpRole::collective;
    p.append_op(std::move(sync_flag));
  }

  std::unique_ptr<optim::Optimizer> inner_;
  AmpOptions o_;
};

}  // namespace

void declare_scaler_state(Program& p, const LossScalerConfig& config) {
  const float init = config.mode == LossScalerConfig::Mode::none ? 1.f : config.init_loss_scaling;
  auto add = [&](const char* name, DType dt, double value) {
    VarDesc v{name, {1}, dt, true, false, true, {VarInit::Kind::constant, value}};
    p.add_var(v);
  };
  add(ScalerVars::scale, DType::f32, init);
  add(ScalerVars::good_steps, DType::i64, 0);
  add(ScalerVars::bad_steps, DType::i64, 0);
  add(ScalerVars::skipped, DType::i64, 0);
  add(ScalerVars::skips_at_min, DType::i64, 0);
  if (!p.has_var(ScalerVars::found_inf)) {
    VarDesc f{ScalerVars::found_inf, {1}, DType::i32, false, false, true, {}};
    p.add_var(f);
  }
}

std::unique_ptr<optim::Optimizer> decorate(std::unique_ptr<optim::Optimizer> inner, AmpOptions options) {
  MIX_CHECK(inner, "amp::decorate of a null optimizer");
  return std::make_unique<Decorated>(std::move(inner), std::move(options));
}

namespace {

// A scaler variable, checked to be the one element of `dtype` declare_scaler_state made.
template <typename ScopeT>
auto& scaler_var(ScopeT& scope, const char* name, DType dtype) {
  auto& t = scope.get(name);
  MIX_CHECK(t.numel() == 1 && t.dtype() == dtype,
            "loss scaler variable '" << name << "' must be one " << dtype_name(dtype));
  return t;
}

// The one element of a scaler variable, on the host.
Tensor scaler_value(const Scope& scope, const char* name, DType dtype) {
  return scaler_var(scope, name, dtype).to(cpu_device());
}

// Sets the one element of a scaler variable, on the host or a device.
template <typename T>
void set_scaler_value(Scope& scope, const char* name, DType dtype, T value) {
  Tensor host = Tensor::empty({1}, dtype);
  host.data<T>()[0] = value;
  scaler_var(scope, name, dtype).copy_from(host);
}

}  // namespace

LossScalerState read_scaler_state(const Scope& scope) {
  LossScalerState s;
  s.scale = scaler_value(scope, ScalerVars::scale, DType::f32).data<float>()[0];
  s.good_steps = scaler_value(scope, ScalerVars::good_steps, DType::i64).data<int64_t>()[0];
  s.bad_steps = scaler_value(scope, ScalerVars::bad_steps, DType::i64).data<int64_t>()[0];
  s.skipped_steps = scaler_value(scope, ScalerVars::skipped, DType::i64).data<int64_t>()[0];
  s.consecutive_skips_at_min = scaler_value(scope, ScalerVars::skips_at_min, DType::i64).data<int64_t>()[0];
  return s;
}

void write_scaler_state(Scope& scope, const LossScalerState& state) {
  set_scaler_value(scope, ScalerVars::scale, DType::f32, state.scale);
  set_scaler_value(scope, ScalerVars::good_steps, DType::i64, state.good_steps);
  set_scaler_value(scope, ScalerVars::bad_steps, DType::i64, state.bad_steps);
  set_scaler_value(scope, ScalerVars::skipped, DType::i64, state.skipped_steps);
  set_scaler_value(scope, ScalerVars::skips_at_min, DType::i64, state.consecutive_skips_at_min);
}

}  // namespace mix::amp
