#include "runtime/optim/optimizer.h"

#include <algorithm>

#include "runtime/ir/op_registry.h"

namespace mix::optim {

void Optimizer::declare_common(Program& p, const std::string& skip) {
  if (!p.has_var(kLearningRate)) {
    VarDesc lr{kLearningRate, {1}, DType::f32, true, false, true, {}};
    p.add_var(lr);
  }
  if (!p.has_var(kOptimizerStep)) {
    VarDesc step{kOptimizerStep, {1}, DType::i64, true, false, true, {}};
    p.add_var(step);
  }
  std::map<std::string, std::vector<std::string>> in{{"Step", {kOptimizerStep}}};
  if (!skip.empty()) in["SkipUpdate"] = {skip};
  OpDesc inc = make_op("increment_step", in, {{"StepOut", {kOptimizerStep}}});
  inc.role = OpRole::optimize;
  p.append_op(std::move(inc));
}

double Optimizer::weight_decay_of(const Program& p, const std::string& param, double weight_decay) const {
  return no_decay_1d_ && p.var(param).shape.size() < 2 ? 0.0 : weight_decay;
}

std::vector<Optimizer::UpdateGroup> Optimizer::update_groups(const Program& p, const ParamGrads& grads,
                                                             double weight_decay) const {
  std::vector<UpdateGroup> groups;
  for (auto& [param, grad] : grads) {
    const double wd = weight_decay_of(p, param, weight_decay);
    auto g = std::find_if(groups.begin(), groups.end(), [&](const UpdateGroup& k) { return k.weight_decay == wd; });
    if (g == groups.end()) g = groups.insert(groups.end(), UpdateGroup{wd, {}, {}});
    g->params.push_back(param);
    g->grads.push_back(grad);
  }
  return groups;
}

std::string Optimizer::declare_slot(Program& p, const std::string& slot, const std::string& param) {
  const std::string name = "optimizer." + slot + "." + param;
  VarDesc v{name, p.var(param).shape, DType::f32, true, false, true, {}};
  p.add_var(v);
  return name;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& o) {
  const double wd = o.effective_weight_decay();
  std::unique_ptr<Optimizer> opt;
  switch (o.kind) {
    case OptimizerKind::sgd: opt = make_sgd(wd); break;
    case OptimizerKind::adamw: opt = make_adamw(o.beta1, o.beta2, o.eps, wd); break;
    case OptimizerKind::momentum: opt = make_momentum(o.momentum, wd); break;
  }
  opt->set_no_decay_1d(o.no_decay_1d);
  return opt;
}

}  // namespace mix::optim
