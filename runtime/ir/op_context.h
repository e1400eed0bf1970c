#pragma once
// OpContext: what one kernel call sees, its op's inputs and outputs by slot
// (bound to tensors in the scope), its attributes and the run's ExecEnv.
#include <string>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/ir/exec_env.h"
#include "runtime/ir/program.h"
#include "runtime/ir/scope.h"

namespace mix {

class OpContext {
 public:
  OpContext(const OpDesc& o, Scope& s, ExecEnv& e) : op(o), scope(s), env(e) {}
  const OpDesc& op;
  Scope& scope;
  ExecEnv& env;

  const Tensor& in(const std::string& slot) const { return scope.get(op.in(slot)); }
  /// nullptr when the optional slot is absent.
  const Tensor* in_opt(const std::string& slot) const;
  std::vector<const Tensor*> ins(const std::string& slot) const;
  /// Allocates output `slot` (index i) with the given shape and dtype.
  Tensor& out(const std::string& slot, const Shape& shape, DType dtype, size_t i = 0);
  /// False when the optional output is absent (a gradient nobody needs).
  bool wants(const std::string& slot) const { return !op.out_or_empty(slot).empty(); }
  /// The existing tensor bound to an output (in-place ops).
  Tensor& out_existing(const std::string& slot, size_t i = 0) { return scope.get(op.outs(slot).at(i)); }
  template <typename T>
  T attr(const std::string& name, T fallback) const {
    return op.attr<T>(name, fallback);
  }
};

}  // namespace mix
