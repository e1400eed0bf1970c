#include "runtime/ir/autodiff.h"

#include <map>
#include <set>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"

namespace mix {

void seed_loss_gradient(Program& p, const std::string& loss, const std::string& scale_var, double multiplier) {
  const VarDesc& l = p.var(loss);
  MIX_CHECK(shape_numel(l.shape) == 1, "the loss '" << loss << "' must be a scalar, has shape " << shape_str(l.shape));
  OpDesc op;
  if (scale_var.empty()) {
    op = make_op("fill_constant", {}, {{"Out", {grad_name(loss)}}},
                 {{"value", multiplier}, {"shape", l.shape}, {"dtype", std::string(dtype_name(l.dtype))}});
  } else {
    // loss@GRAD = loss_scale: the whole backward pass then carries scaled gradients.
    op = make_op("fill_like_scalar", {{"X", {scale_var}}}, {{"Out", {grad_name(loss)}}}, {{"shape", l.shape}});
    if (multiplier != 1.0) op.attrs["multiplier"] = multiplier;
  }
  op.role = OpRole::loss;
  p.append_op(std::move(op));
}

BackwardResult append_backward(Program& p, const std::string& loss) {
  const OpRegistry& reg = OpRegistry::instance();
  const size_t n_forward = p.ops().size();
  MIX_CHECK(p.producer(grad_name(loss)), "seed " << grad_name(loss) << " before append_backward");

  // Variables that depend on a trainable parameter: only they need gradients.
  std::set<std::string> needs_grad;
  for (auto& v : p.vars())
    if (v.is_parameter && !v.stop_gradient) needs_grad.insert(v.name);
  for (size_t i = 0; i < n_forward; ++i) {
    const OpDesc& op = p.ops()[i];
    if (op.role != OpRole::forward) continue;
    bool any = false;
    for (auto& n : op.all_inputs()) any = any || needs_grad.count(n);
    if (!any) continue;
    for (auto& n : op.all_outputs())
      if (!p.var(n).stop_gradient) needs_grad.insert(n);
  }

  // Walk backwards. Each contribution to a variable's gradient gets its own
  // temporary name; afterwards single contributions are renamed to X@GRAD and
  // multiple ones summed into it.
  std::map<std::string, std::vector<std::string>> contributions;  // var -> partial grad names
  std::set<std::string> has_grad = {loss};
  std::vector<OpDesc> grad_ops;
  auto current_grad = [&](const std::string& v) -> std::string {
    if (v == loss) return grad_name(loss);
    return has_grad.count(v) ? grad_name(v) : std::string();
  };

  for (size_t i = n_forward; i-- > 0;) {
    const OpDesc& fwd = p.ops()[i];
    if (fwd.role != OpRole::forward) continue;
    bool flows = false;
    for (auto& n : fwd.all_outputs()) flows = flows || has_grad.count(n);
    if (!flows) continue;
    bool wants_inputs = false;
    for (auto& n : fwd.all_inputs()) wants_inputs = wants_inputs || needs_grad.count(n);
    if (!wants_inputs) continue;
    const OpInfo& info = reg.get(fwd.type);
    MIX_CHECK(info.grad, "op " << fwd.type << " has no gradient, but a parameter's gradient flows through it");

    std::vector<std::string> written;
    GradContext g{p, current_grad, [&](const std::string& v) -> std::string {
                    if (!needs_grad.count(v)) return {};
                    auto& list = contributions[v];
                    std::string name = grad_name(v) + "@PART@" + std::to_string(list.size());
                    list.push_back(name);
                    written.push_back(v);
                    return name;
                  }};
    std::vector<OpDesc> ops = info.grad(fwd, g);
    for (auto& op : ops) {
      op.role = OpRole::backward;
      grad_ops.push_back(std::move(op));
    }
    for (auto& v : written) has_grad.insert(v);
  }

  // Resolve partial names: rename singletons, sum multiples right after the last contributor.
  std::map<std::string, std::string> rename;
  std::map<size_t, std::vector<OpDesc>> sums_after;  // grad op index -> sum ops to insert after it
  for (auto& [var, parts] : contributions) {
    if (parts.size() == 1) {
      rename[parts[0]] = grad_name(var);
      continue;
    }
    size_t last = 0;
    for (size_t k = 0; k < grad_ops.size(); ++k)
      for (auto& o : grad_ops[k].all_outputs())
        for (auto& part : parts)
          if (o == part) last = k;
    OpDesc s = make_op("sum", {{"X", parts}}, {{"Out", {grad_name(var)}}});
    s.role = OpRole::backward;
    sums_after[last].push_back(std::move(s));
  }
  auto apply_rename = [&](std::map<std::string, std::vector<std::string>>& slots) {
    for (auto& [slot, names] : slots)
      for (auto& n : names)
        if (auto it = rename.find(n); it != rename.end()) n = it->second;
  };

  // Gradient variables take the shape and dtype of the variable they differentiate.
  auto declare_grad = [&](const std::string& name, const std::string& var) {
    const VarDesc& v = p.var(var);
    declare_var(p, name, v.shape, v.dtype);
  };
  for (auto& [var, parts] : contributions) {
    declare_grad(grad_name(var), var);
    if (parts.size() > 1)
      for (auto& part : parts) declare_grad(part, var);
  }

  BackwardResult result;
  result.first_backward_op = p.ops().size();
  for (size_t k = 0; k < grad_ops.size(); ++k) {
    apply_rename(grad_ops[k].inputs);
    apply_rename(grad_ops[k].outputs);
    p.append_op(std::move(grad_ops[k]));
    if (auto it = sums_after.find(k); it != sums_after.end())
      for (auto& s : it->second) p.append_op(std::move(s));
  }
  for (auto& name : p.parameters()) {
    if (contributions.count(name)) result.param_grads.emplace_back(name, grad_name(name));
  }
  return result;
}

}  // namespace mix
