#pragma once
// The op registry: for each op type, its shape/dtype inference, its kernels
// and the maker of its gradient ops. Each op's file registers all three side
// by side (runtime/ops/<op>.cc), so an op's backward lives next to its forward.
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/device.h"
#include "runtime/program.h"
#include "runtime/tensor.h"

namespace mix {

class OpTimer;  // runtime/device_backend.h
namespace collective {
class Communicator;
}

/// Named tensors of one training process: parameters, optimizer state and the
/// temporaries of the step that is running.
class Scope {
 public:
  Tensor* find(const std::string& name);
  const Tensor* find(const std::string& name) const;
  /// Throws naming the variable when it is absent.
  Tensor& get(const std::string& name);
  const Tensor& get(const std::string& name) const;
  void set(const std::string& name, Tensor t) { vars_[name] = std::move(t); }
  void erase(const std::string& name) { vars_.erase(name); }
  bool has(const std::string& name) const { return vars_.count(name) > 0; }
  const std::unordered_map<std::string, Tensor>& all() const { return vars_; }

 private:
  std::unordered_map<std::string, Tensor> vars_;
};

/// Per-run services available to kernels.
struct ExecEnv {
  Device device = cpu_device();
  collective::Communicator* comm = nullptr;  // collective ops need it
  int64_t step = 0;                          // the optimizer step being run (1-based)
  /// When set: `step`, in the memory of `device` (i64 [1]). Ops whose work
  /// depends on the step (OpInfo::varies_by_step) then read it there (a GPU's
  /// kernels read it on the device), so that a step recorded once replays
  /// with each run's step (runtime/step_graph.h sets it while recording, and
  /// writes the step before each replay). Null: they use `step`.
  const int64_t* device_step = nullptr;
  /// This process's rank (comm->rank() when there is a communicator; the
  /// trainer sets it). A copy here because runtime/ must not depend on
  /// collective/: dropout mixes it into its mask key, so ranks drop different units.
  int rank = 0;
  /// When set, the executor adds each op's time here, by op type (profiling):
  /// its wall time on the host, or with `op_timer` its time on the device.
  std::map<std::string, double>* op_seconds = nullptr;
  /// The device's op timer (DeviceBackend::make_op_timer), for op_seconds.
  OpTimer* op_timer = nullptr;
  /// False for evaluation: batch_norm normalises with its running statistics
  /// and updates nothing (PyTorch's model.eval()).
  bool training = true;
  /// Collectives started and not yet waited for, by the variable they fill
  /// (c_allreduce_start puts the communicator's request id here, c_allreduce_wait takes it).
  std::unordered_map<std::string, uint64_t> in_flight;
  /// Called by the executor after each op while `in_flight` is not empty, so
  /// that started collectives advance during backward (MPI moves non-blocking
  /// collectives only inside MPI calls). Whoever owns the communicator sets it
  /// (to comm->progress()); runtime/ does not depend on collective/.
  std::function<void()> progress;
};

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
  /// right (runtime/step_graph.h).
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
  std::vector<std::string> types() const;

 private:
  std::unordered_map<std::string, OpInfo> ops_;
  std::unordered_map<std::string, KernelFn> pending_cuda_;
};

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
