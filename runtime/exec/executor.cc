#include "runtime/exec/executor.h"

#include <chrono>
#include <map>

#include "runtime/core/check.h"
#include "runtime/core/device_backend.h"

namespace mix {

std::string with_op_context(const std::string& message, size_t op_index, const std::string& op_type) {
  return message + " (in op " + std::to_string(op_index) + ": " + op_type + ")";
}

Executor::Executor(const Program& program, std::set<std::string> keep, OpFilter filter)
    : program_(program), keep_(std::move(keep)) {
  for (size_t i = 0; i < program.ops().size(); ++i)
    if (filter(program.ops()[i])) op_indices_.push_back(i);

  // Last position (in this executor's sequence) at which each variable is read or written.
  std::map<std::string, size_t> last_use;
  for (size_t k = 0; k < op_indices_.size(); ++k) {
    const OpDesc& op = program.ops()[op_indices_[k]];
    for (auto& n : op.all_inputs()) last_use[n] = k;
    for (auto& n : op.all_outputs()) last_use[n] = k;
  }
  release_after_.assign(op_indices_.size(), {});
  for (auto& [name, k] : last_use) {
    if (keep_.count(name)) continue;
    if (program.has_var(name) && program.var(name).persistable) continue;
    release_after_[k].push_back(name);
  }
}

void Executor::run(Scope& scope, ExecEnv& env) const {
  const OpRegistry& reg = OpRegistry::instance();
  // Device-timed profiling: a mark before the first op and after each.
  OpTimer* const timer = env.op_seconds ? env.op_timer : nullptr;
  if (timer) timer->start();
  for (size_t k = 0; k < op_indices_.size(); ++k) {
    const OpDesc& op = program_.ops()[op_indices_[k]];
    const OpInfo& info = reg.get(op.type);
    const KernelFn& kernel = env.device.kind == DeviceKind::cpu ? info.cpu : info.cuda;
    MIX_CHECK(kernel, "op " << op.type << " has no kernel for device " << env.device.str());
    OpContext ctx(op, scope, env);
    try {
      if (env.op_seconds && !timer) {
        const auto t0 = std::chrono::steady_clock::now();
        kernel(ctx);
        (*env.op_seconds)[op.type] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      } else {
        kernel(ctx);
        if (timer) timer->mark();
      }
    } catch (const Error& e) {
      const std::string where = with_op_context(e.what(), op_indices_[k], op.type);
      // Out of memory keeps its type: callers may take a way that needs less.
      if (dynamic_cast<const OutOfMemoryError*>(&e)) throw OutOfMemoryError(where);
      throw Error(where);
    }
    for (auto& n : release_after_[k]) scope.erase(n);
    if (env.progress && !env.in_flight.empty()) env.progress();
  }
  if (timer) {
    const std::vector<double> secs = timer->collect();
    MIX_CHECK(secs.size() == op_indices_.size(),
              "op timer gave " << secs.size() << " times for " << op_indices_.size() << " ops");
    for (size_t k = 0; k < secs.size(); ++k) (*env.op_seconds)[program_.ops()[op_indices_[k]].type] += secs[k];
  }
  // A start without its wait would leave a collective running into the next
  // step (and every rank's next collective out of step): a program bug.
  if (!env.in_flight.empty()) {
    const std::string name = env.in_flight.begin()->first;
    const size_t n = env.in_flight.size();
    env.in_flight.clear();
    MIX_FAIL("the program ended with " << n << " collective(s) started and never waited for ("
                                       << name << "); every c_allreduce_start needs its c_allreduce_wait");
  }
}

MemoryPlan Executor::plan(int64_t batch) const {
  MemoryPlan p;
  p.release_after = release_after_;
  auto bytes_of = [&](const std::string& n) -> size_t {
    if (!program_.has_var(n)) return 0;
    const VarDesc& v = program_.var(n);
    int64_t count = 1;
    for (int64_t d : v.shape) count *= d < 0 ? batch : d;
    return static_cast<size_t>(count) * dtype_size(v.dtype);
  };
  for (auto& v : program_.vars())
    if (v.persistable) p.persistent_bytes += bytes_of(v.name);

  // Views (reshape2, flatten, a one-gradient bucket's Buffer, the
  // pass-through gradients of elementwise_add_grad) share an input's storage:
  // a storage is counted once, under the variable that owns it (its root),
  // from the op that writes the root until the last of the root and its views
  // is released.
  std::map<std::string, std::string> root_of;  // live variable -> the variable owning its storage
  std::map<std::string, int> names_of_root;    // root -> live variables sharing its storage
  size_t live_bytes = 0;
  for (size_t k = 0; k < op_indices_.size(); ++k) {
    const OpDesc& op = program_.ops()[op_indices_[k]];
    const ViewFn& viewed_input = OpRegistry::instance().get(op.type).viewed_input;
    for (auto& n : op.all_outputs()) {
      if (root_of.count(n) || (program_.has_var(n) && program_.var(n).persistable)) continue;
      const std::string base = viewed_input ? viewed_input(op, n) : std::string();
      if (!base.empty()) {
        // A view of a feed or a persistable variable adds no temporary bytes.
        if (auto it = root_of.find(base); it != root_of.end()) {
          root_of[n] = it->second;
          ++names_of_root[it->second];
        }
        continue;
      }
      root_of[n] = n;
      names_of_root[n] = 1;
      live_bytes += bytes_of(n);
    }
    p.peak_temporary_bytes = std::max(p.peak_temporary_bytes, live_bytes);
    for (auto& n : release_after_[k]) {
      auto it = root_of.find(n);
      if (it == root_of.end()) continue;
      if (--names_of_root[it->second] == 0) {
        live_bytes -= bytes_of(it->second);
        names_of_root.erase(it->second);
      }
      root_of.erase(it);
    }
  }
  return p;
}

}  // namespace mix
