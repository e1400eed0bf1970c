#include "runtime/ir/op_registry.h"

#include "runtime/core/check.h"

namespace mix {

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

void infer_op(Program& p, OpDesc& op) {
  const OpInfo& info = OpRegistry::instance().get(op.type);
  if (info.infer) info.infer(p, op);
}

}  // namespace mix
