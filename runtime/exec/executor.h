#pragma once
// Runs a Program's ops on a device over a Scope, releasing every temporary
// right after its last use. The release plan is computed once per program;
// it also yields the planned peak of temporary memory for a given batch size.
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"

namespace mix {

struct MemoryPlan {
  /// release_after[i]: temporaries whose last use is op i.
  std::vector<std::vector<std::string>> release_after;
  /// Bytes of persistable variables (parameters, optimizer and scaler state).
  size_t persistent_bytes = 0;
  /// Largest sum of live temporaries over the op sequence, for the batch size planned.
  size_t peak_temporary_bytes = 0;
};

/// Which ops of the program a run executes.
using OpFilter = std::function<bool(const OpDesc&)>;
inline bool all_ops(const OpDesc&) { return true; }
inline bool forward_ops(const OpDesc& op) { return op.role == OpRole::forward || op.role == OpRole::loss; }

/// An op's error as the executor reports it: the message, then which op
/// (its index in the program and its type). Checks made after a step from
/// an op's state (amp::check_loss_scale_not_stuck) name the op the same way.
std::string with_op_context(const std::string& message, size_t op_index, const std::string& op_type);

class Executor {
 public:
  /// `keep`: temporaries the caller reads after run() (e.g. the loss); never released.
  /// The executor refers to `program`, which must outlive it and not move.
  Executor(const Program& program, std::set<std::string> keep, OpFilter filter = all_ops);

  void run(Scope& scope, ExecEnv& env) const;
  /// The release plan, with sizes computed for the batch dimension `batch`.
  MemoryPlan plan(int64_t batch) const;

 private:
  const Program& program_;
  std::set<std::string> keep_;
  std::vector<size_t> op_indices_;  // ops this executor runs, in order
  std::vector<std::vector<std::string>> release_after_;
};

}  // namespace mix
