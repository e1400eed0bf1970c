// SGD with momentum, torch.optim.SGD semantics (dampening 0, optional Nesterov).
#include <map>
#include <string>
#include <vector>

#include "runtime/kernels/functors.h"
#include "runtime/optim/optimizer.h"
#include "runtime/optim/update_op.h"

namespace mix::optim {
namespace {

void momentum_cpu(OpContext& ctx) {
  if (skip_this_step(ctx)) return;
  const fn::MomentumUpdate update{learning_rate(ctx), ctx.attr<float>("mu", 0.9f), ctx.attr<float>("weight_decay", 0.f),
                                  ctx.attr<bool>("use_nesterov", false)};
  for (size_t k = 0, n = updated_count(ctx, {"VelocityOut"}); k < n; ++k) {
    auto [param, grad] = param_and_grad(ctx, k);
    Tensor& velocity = state_of(ctx, "VelocityOut", k, *param);
    // Distinct tensors: __restrict lets the compiler vectorise the update.
    float* __restrict p = param->data<float>();
    float* __restrict v = velocity.data<float>();
    const float* __restrict g = grad->data<float>();
    for (int64_t i = 0; i < param->numel(); ++i) update(p[i], v[i], g[i]);
  }
}

MIX_REGISTER_OP("momentum", OpInfo{{}, momentum_cpu, {}, {}});

class Momentum final : public Optimizer {
 public:
  Momentum(double mu, double wd, bool nesterov) : mu_(mu), weight_decay_(wd), nesterov_(nesterov) {}
  std::string name() const override { return "momentum"; }
  void append_update_ops(Program& p, const ParamGrads& grads, const std::string& skip) override {
    declare_common(p, skip);
    // Slots declared in parameter order (the checkpoint's order), whatever the groups.
    std::map<std::string, std::string> velocity_of;
    for (auto& [param, grad] : grads) velocity_of[param] = declare_slot(p, "momentum_buffer", param);
    for (const UpdateGroup& g : update_groups(p, grads, weight_decay_)) {
      std::vector<std::string> velocity;
      for (auto& param : g.params) velocity.push_back(velocity_of.at(param));
      auto inputs = update_inputs(g.params, g.grads, kLearningRate, skip);
      inputs["Velocity"] = velocity;
      OpDesc op = make_op("momentum", inputs, {{"ParamOut", g.params}, {"VelocityOut", velocity}},
                          {{"mu", mu_}, {"weight_decay", g.weight_decay}, {"use_nesterov", nesterov_}});
      op.role = OpRole::optimize;
      p.append_op(std::move(op));
    }
  }

 private:
  double mu_, weight_decay_;
  bool nesterov_;
};

}  // namespace

std::unique_ptr<Optimizer> make_momentum(double momentum, double weight_decay, bool nesterov) {
  return std::make_unique<Momentum>(momentum, weight_decay, nesterov);
}

}  // namespace mix::optim
