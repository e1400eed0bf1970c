// SGD with momentum, torch.optim.SGD semantics (dampening 0, optional Nesterov).
#include "runtime/kernels/functors.h"
#include "runtime/optim/optimizer.h"
#include "runtime/optim/update_op.h"

namespace mix::optim {
namespace {

void momentum_cpu(OpContext& ctx) {
  if (skip_this_step(ctx)) return;
  auto [param, grad] = param_and_grad(ctx);
  Tensor& velocity = ctx.out_existing("VelocityOut");
  const fn::MomentumUpdate update{learning_rate(ctx), ctx.attr<float>("mu", 0.9f), ctx.attr<float>("weight_decay", 0.f),
                                  ctx.attr<bool>("use_nesterov", false)};
  // Distinct tensors: __restrict lets the compiler vectorise the update.
  float* __restrict p = param->data<float>();
  float* __restrict v = velocity.data<float>();
  const float* __restrict g = grad->data<float>();
  for (int64_t i = 0; i < param->numel(); ++i) update(p[i], v[i], g[i]);
}

MIX_REGISTER_OP("momentum", OpInfo{{}, momentum_cpu, {}, {}});

class Momentum final : public Optimizer {
 public:
  Momentum(double mu, double wd, bool nesterov) : mu_(mu), weight_decay_(wd), nesterov_(nesterov) {}
  std::string name() const override { return "momentum"; }
  void append_update_ops(Program& p, const ParamGrads& grads, const std::string& skip) override {
    declare_common(p, skip);
    for (auto& [param, grad] : grads) {
      const std::string velocity = declare_slot(p, "momentum_buffer", param);
      auto inputs = update_inputs(param, grad, kLearningRate, skip);
      inputs["Velocity"] = {velocity};
      OpDesc op = make_op(
          "momentum", inputs, {{"ParamOut", {param}}, {"VelocityOut", {velocity}}},
          {{"mu", mu_}, {"weight_decay", weight_decay_of(p, param, weight_decay_)}, {"use_nesterov", nesterov_}});
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
