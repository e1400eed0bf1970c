#pragma once
// The op registry: for each op type, its shape/dtype inference, its kernels
// and the maker of its gradient ops. Each op's file registers all three side
// by side (runtime/ops/<op>.cc), so an op's backward lives next to its forward.
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/ir/op_context.h"
#include "runtime/ir/program.h"

namespace mix {

/// Hands a gradient maker the names to use.
struct GradContext {
  const Program& program;
  /// Gradient of forward output `var`; empty when no gradient flows into it.
  std::function<std::string(const std::string& var)> grad_of_output;
  /// Name the gradient op must write for forward input `var`; empty when `var` needs none.
  std::function<std::string(const std::string& var)> grad_for_input;
};

using InferFn = std::function<void(Program&, OpDesc&)>;
using KernelFn = std::function<void(OpContext&)>;
using GradMaker = std::function<std::vector<OpDesc>(const OpDesc& fwd, GradContext& g)>;

/// The input variable whose storage this instance of the op gives to output
/// `out` (a view: no storage of its own), or "" when `out` has storage of its
/// own. The executor's memory plan counts a view's bytes once, with its input's,
/// for as long as either lives.
using ViewFn = std::function<std::string(const OpDesc&, const std::string& out)>;

struct OpInfo {
  InferFn infer;         // declares outputs (shape with -1 batch, dtype)
  KernelFn cpu;          // the CPU kernel (the reference)
  KernelFn cuda;         // empty until a CUDA kernel is registered
  GradMaker grad;        // empty: the op has no gradient (or is itself a gradient op)
  ViewFn viewed_input = {};  // empty: outputs have storage of their own
  /// The kernel's work depends on ExecEnv::step (dropout's mask key,
  /// inject_overflow's chosen step): it must read the step from
  /// ExecEnv::device_step when that is set, so that a recorded step replays
  /// right (runtime/exec/step_graph.h).
  bool varies_by_step = false;
  /// The kernel waits on the host for its own device work (a blocking
  /// collective: c_allreduce_sum, c_allreduce_max). A recording queues work
  /// without running it, so a step with such an op cannot be recorded
  /// (StepGraph::why_not).
  bool host_waits = false;
};

/// ViewFn of ops whose every output is a view of input `slot` (reshape2, flatten).
inline ViewFn views_of(std::string slot) {
  return [slot](const OpDesc& op, const std::string&) { return op.in(slot); };
}

class OpRegistry {
 public:
  static OpRegistry& instance();
  bool add(const std::string& type, OpInfo info);
  const OpInfo& get(const std::string& type) const;
  bool has(const std::string& type) const { return ops_.count(type) > 0; }
  /// Adds a CUDA kernel to an op registered elsewhere. Static initialisers run
  /// in no fixed order across files, so a kernel for an op not registered yet
  /// is held until its op arrives.
  bool add_cuda_kernel(const std::string& type, KernelFn fn);

 private:
  std::unordered_map<std::string, OpInfo> ops_;
  std::unordered_map<std::string, KernelFn> pending_cuda_;
};

/// Runs an op type's inference (OpInfo::infer): declares or updates its
/// output VarDescs. Program::insert_op calls it through program.h's declaration.
void infer_op(Program& p, OpDesc& op);

/// Static registration: `MIX_REGISTER_OP("relu", OpInfo{...});` in the op's file.
#define MIX_OP_CONCAT_(a, b) a##b
#define MIX_OP_CONCAT(a, b) MIX_OP_CONCAT_(a, b)
#define MIX_REGISTER_OP(type, ...) \
  static const bool MIX_OP_CONCAT(mix_op_registered_, __COUNTER__) = ::mix::OpRegistry::instance().add(type, __VA_ARGS__)

// ---- helpers for writing infer functions and grad makers ----------------------

/// Declares (or redeclares) variable `name` with a shape and dtype.
void declare_var(Program& p, const std::string& name, const Shape& shape, DType dtype);
/// Infer for ops whose output "Out" has the shape and dtype of input `slot`.
InferFn same_as_input(const std::string& slot = "X", const std::string& out_slot = "Out");
/// An OpDesc with the given type, slots and attrs.
OpDesc make_op(std::string type, std::map<std::string, std::vector<std::string>> inputs,
               std::map<std::string, std::vector<std::string>> outputs, std::map<std::string, Attr> attrs = {});

}  // namespace mix
