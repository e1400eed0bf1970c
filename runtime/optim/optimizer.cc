#include "runtime/optim/optimizer.h"

#include <algorithm>

#include "runtime/ir/autodiff.h"
#include "runtime/ir/op_registry.h"

namespace mix::optim {

TrainProgram Optimizer::minimize(Program& p, const std::string& loss, const GradSyncPass& sync) {
  seed_loss_gradient(p, loss);
  BackwardResult bw = append_backward(p, loss);
  TrainProgram t;
  t.loss = loss;
  t.param_grads = sync ? sync(p, bw.param_grads) : bw.param_grads;
  append_update_ops(p, t.param_grads, "");
  return t;
}

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

}  // namespace mix::optim
