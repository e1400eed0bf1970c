// AdamW, torch.optim.AdamW semantics (decoupled weight decay, bias corrections
// from the count of applied steps, optimizer.step, which skipped steps do not advance).
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/kernels/functors.h"
#include "runtime/optim/optimizer.h"
#include "runtime/optim/update_op.h"

namespace mix::optim {
namespace {

void adamw_cpu(OpContext& ctx) {
  if (skip_this_step(ctx)) return;
  const int64_t t = ctx.in("Step").data<int64_t>()[0];
  MIX_CHECK(t >= 1, "adamw: optimizer.step is " << t << " (the increment_step op must run first)");
  // Bias corrections in double, as PyTorch computes them on the host.
  const fn::AdamWUpdate update =
      fn::adamw_update_for_step(learning_rate(ctx), ctx.attr<double>("beta1", 0.9), ctx.attr<double>("beta2", 0.999),
                                ctx.attr<float>("epsilon", 1e-8f), ctx.attr<float>("weight_decay", 0.01f), t);
  for (size_t k = 0, n = updated_count(ctx, {"Moment1Out", "Moment2Out"}); k < n; ++k) {
    auto [param, grad] = param_and_grad(ctx, k);
    float* __restrict pp = param->data<float>();
    float* __restrict mp = state_of(ctx, "Moment1Out", k, *param).data<float>();
    float* __restrict vp = state_of(ctx, "Moment2Out", k, *param).data<float>();
    const float* __restrict g = grad->data<float>();
    for (int64_t i = 0; i < param->numel(); ++i) update(pp[i], mp[i], vp[i], g[i]);
  }
}

MIX_REGISTER_OP("adamw", OpInfo{{}, adamw_cpu, {}, {}});

class AdamW final : public Optimizer {
 public:
  AdamW(double b1, double b2, double eps, double wd) : beta1_(b1), beta2_(b2), eps_(eps), weight_decay_(wd) {}
  std::string name() const override { return "adamw"; }
  void append_update_ops(Program& p, const ParamGrads& grads, const std::string& skip) override {
    declare_common(p, skip);
    // Slots declared in parameter order (the checkpoint's order), whatever the groups.
    std::map<std::string, std::pair<std::string, std::string>> moments_of;
    for (auto& [param, grad] : grads)
      moments_of[param] = {declare_slot(p, "exp_avg", param), declare_slot(p, "exp_avg_sq", param)};
    for (const UpdateGroup& g : update_groups(p, grads, weight_decay_)) {
      std::vector<std::string> m, v;
      for (auto& param : g.params) {
        m.push_back(moments_of.at(param).first);
        v.push_back(moments_of.at(param).second);
      }
      auto inputs = update_inputs(g.params, g.grads, kLearningRate, skip);
      inputs["Moment1"] = m;
      inputs["Moment2"] = v;
      inputs["Step"] = {kOptimizerStep};
      OpDesc op = make_op("adamw", inputs, {{"ParamOut", g.params}, {"Moment1Out", m}, {"Moment2Out", v}},
                          {{"beta1", beta1_}, {"beta2", beta2_}, {"epsilon", eps_}, {"weight_decay", g.weight_decay}});
      op.role = OpRole::optimize;
      p.append_op(std::move(op));
    }
  }

 private:
  double beta1_, beta2_, eps_, weight_decay_;
};

}  // namespace

std::unique_ptr<Optimizer> make_adamw(double beta1, double beta2, double eps, double weight_decay) {
  return std::make_unique<AdamW>(beta1, beta2, eps, weight_decay);
}

}  // namespace mix::optim
