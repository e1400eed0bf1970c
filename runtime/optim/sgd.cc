// Plain SGD with optional (coupled, PyTorch-style) weight decay.
#include "runtime/kernels/functors.h"
#include "runtime/optim/optimizer.h"
#include "runtime/optim/update_op.h"

namespace mix::optim {
namespace {

void sgd_cpu(OpContext& ctx) {
  if (skip_this_step(ctx)) return;
  const fn::SgdUpdate update{learning_rate(ctx), ctx.attr<float>("weight_decay", 0.f)};
  for (size_t k = 0, n = updated_count(ctx); k < n; ++k) {
    auto [param, grad] = param_and_grad(ctx, k);
    float* __restrict p = param->data<float>();
    const float* __restrict g = grad->data<float>();
    for (int64_t i = 0; i < param->numel(); ++i) update(p[i], g[i]);
  }
}

MIX_REGISTER_OP("sgd", OpInfo{{}, sgd_cpu, {}, {}});

class Sgd final : public Optimizer {
 public:
  explicit Sgd(double wd) : weight_decay_(wd) {}
  std::string name() const override { return "sgd"; }
  void append_update_ops(Program& p, const ParamGrads& grads, const std::string& skip) override {
    declare_common(p, skip);
    for (const UpdateGroup& g : update_groups(p, grads, weight_decay_)) {
      OpDesc op = make_op("sgd", update_inputs(g.params, g.grads, kLearningRate, skip), {{"ParamOut", g.params}},
                          {{"weight_decay", g.weight_decay}});
      op.role = OpRole::optimize;
      p.append_op(std::move(op));
    }
  }

 private:
  double weight_decay_;
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(double weight_decay) { return std::make_unique<Sgd>(weight_decay); }

}  // namespace mix::optim
