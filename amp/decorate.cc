#include "amp/decorate.h"

#include "amp/rewrite.h"
#include "runtime/autodiff.h"
#include "runtime/check.h"
#include "runtime/op_registry.h"

namespace mix::amp {

namespace {

class Decorated final : public optim::Optimizer {
 public:
  Decorated(std::unique_ptr<optim::Optimizer> inner, AmpOptions o) : inner_(std::move(inner)), o_(std::move(o)) {}
  std::string name() const override { return "amp(" + inner_->name() + ")"; }

  optim::TrainProgram minimize(Program& p, const std::string& loss, const optim::GradSyncPass& sync) override {
    rewrite(p, o_.lists, o_.low_dtype);
    declare_scaler_state(p, o_.scaler);
    seed_loss_gradient(p, loss, ScalerVars::scale);
    BackwardResult bw = append_backward(p, loss);
    optim::TrainProgram t;
    t.loss = loss;
    t.param_grads = sync ? sync(p, bw.param_grads) : bw.param_grads;
    t.found_inf = ScalerVars::found_inf;

    std::vector<std::string> grads;
    for (auto& [param, grad] : t.param_grads) grads.push_back(grad);

    if (o_.inject) {
      std::vector<std::string> targets;
      for (auto& [param, grad] : t.param_grads)
        if (o_.inject->param.empty() || o_.inject->param == param) targets.push_back(grad);
      MIX_CHECK(!targets.empty(), "--inject-overflow names parameter '" << o_.inject->param
                                                                        << "', which the model does not have");
      OpDesc inj = make_op("inject_overflow", {{"X", targets}}, {{"Out", targets}},
                           {{"step", o_.inject->step}, {"rank", static_cast<int64_t>(o_.inject->rank)}});
      inj.role = OpRole::collective;
      p.append_op(std::move(inj));
    }

    OpDesc check = make_op("check_finite_and_unscale", {{"X", grads}, {"Scale", {ScalerVars::scale}}},
                           {{"Out", grads}, {"FoundInfinite", {ScalerVars::found_inf}}});
    check.role = OpRole::optimize;
    p.append_op(std::move(check));

    // Every rank takes the same decision: the global flag is the MAX of the local ones.
    OpDesc sync_flag = make_op("c_allreduce_max", {{"X", {ScalerVars::found_inf}}}, {{"Out", {ScalerVars::found_inf}}},
                               {{"traffic", std::string("control")}});
    sync_flag.role = OpRole::collective;
    p.append_op(std::move(sync_flag));

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

}  // namespace mix::amp
