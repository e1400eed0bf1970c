#include "runtime/op_registry.h"

#include <algorithm>

#include "runtime/check.h"

namespace mix {

Tensor* Scope::find(const std::string& name) {
  auto it = vars_.find(name);
  return it == vars_.end() ? nullptr : &it->second;
}
const Tensor* Scope::find(const std::string& name) const {
  auto it = vars_.find(name);
  return it == vars_.end() ? nullptr : &it->second;
}
Tensor& Scope::get(const std::string& name) {
  Tensor* t = find(name);
  MIX_CHECK(t, "variable '" << name << "' has no value (not fed, not initialised, or already released)");
  return *t;
}
const Tensor& Scope::get(const std::string& name) const {
  const Tensor* t = find(name);
  MIX_CHECK(t, "variable '" << name << "' has no value (not fed, not initialised, or already released)");
  return *t;
}

const Tensor* OpContext::in_opt(const std::string& slot) const {
  const std::string n = op.in_or_empty(slot);
  return n.empty() ? nullptr : &scope.get(n);
}

std::vector<const Tensor*> OpContext::ins(const std::string& slot) const {
  std::vector<const Tensor*> r;
  for (auto& n : op.ins(slot)) r.push_back(&scope.get(n));
  return r;
}

Tensor& OpContext::out(const std::string& slot, const Shape& shape, DType dtype, size_t i) {
  const std::string& name = op.outs(slot).at(i);
  // Outputs that already hold a tensor of the right size, on the op's device,
  // are overwritten in place (persistable state such as optimizer slots, or
  // in-place ops). One on another device is replaced: a kernel writes through
  // the raw pointer.
  Tensor* existing = scope.find(name);
  if (existing && existing->defined() && existing->shape() == shape && existing->dtype() == dtype &&
      existing->device() == env.device)
    return *existing;
  scope.set(name, Tensor::empty(shape, dtype, env.device));
  return scope.get(name);
}

OpRegistry& OpRegistry::instance() {
  static OpRegistry r;
  return r;
}

bool OpRegistry::add(const std::string& type, OpInfo info) {
  MIX_CHECK(!ops_.count(type), "op type '" << type << "' registered twice");
  if (auto it = pending_cuda_.find(type); it != pending_cuda_.end()) {
    info.cuda = std::move(it->second);
    pending_cuda_.erase(it);
  }
  ops_[type] = std::move(info);
  return true;
}

bool OpRegistry::add_cuda_kernel(const std::string& type, KernelFn fn) {
  auto it = ops_.find(type);
  if (it == ops_.end()) {
    pending_cuda_[type] = std::move(fn);
  } else {
    it->second.cuda = std::move(fn);
  }
  return true;
}

const OpInfo& OpRegistry::get(const std::string& type) const {
  auto it = ops_.find(type);
  MIX_CHECK(it != ops_.end(), "unknown op type '" << type << "'");
  return it->second;
}

std::vector<std::string> OpRegistry::types() const {
  std::vector<std::string> r;
  for (auto& [k, v] : ops_) r.push_back(k);
  std::sort(r.begin(), r.end());
  return r;
}

void declare_var(Program& p, const std::string& name, const Shape& shape, DType dtype) {
  if (p.has_var(name)) {
    VarDesc& v = p.var(name);
    v.shape = shape;
    v.dtype = dtype;
    return;
  }
  VarDesc v;
  v.name = name;
  v.shape = shape;
  v.dtype = dtype;
  p.add_var(v);
}

InferFn same_as_input(const std::string& slot, const std::string& out_slot) {
  return [slot, out_slot](Program& p, OpDesc& op) {
    const VarDesc& x = p.var(op.in(slot));
    declare_var(p, op.out(out_slot), x.shape, x.dtype);
  };
}

OpDesc make_op(std::string type, std::map<std::string, std::vector<std::string>> inputs,
               std::map<std::string, std::vector<std::string>> outputs, std::map<std::string, Attr> attrs) {
  OpDesc op;
  op.type = std::move(type);
  op.inputs = std::move(inputs);
  op.outputs = std::move(outputs);
  op.attrs = std::move(attrs);
  return op;
}

}  // namespace mix
