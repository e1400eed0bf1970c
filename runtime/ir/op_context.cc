#include "runtime/ir/op_context.h"

#include "runtime/core/check.h"

namespace mix {

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

}  // namespace mix
