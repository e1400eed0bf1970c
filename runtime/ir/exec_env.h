#pragma once
// ExecEnv: what a kernel may use besides its op's tensors (the device, the
// communicator, the step, the profiler). The executor fills it; kernels read it.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>

#include "runtime/core/device.h"

namespace mix {

class OpTimer;  // runtime/core/device_backend.h
namespace collective {
class Communicator;  // collective/communicator.h: runtime/ does not depend on collective/
}

/// Per-run services available to kernels.
struct ExecEnv {
  Device device = cpu_device();
  collective::Communicator* comm = nullptr;  // collective ops need it
  int64_t step = 0;                          // the optimizer step being run (1-based)
  int64_t micro_batch = 0;                   // its micro-batch, 0 to K - 1 (--grad-accum-steps K)
  /// When set: `step`, in the memory of `device` (i64 [1]). Ops whose work
  /// depends on the step (OpInfo::varies_by_step) then read it there (a GPU's
  /// kernels read it on the device), so that a step recorded once replays
  /// with each run's step (runtime/exec/step_graph.h sets it while recording, and
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

}  // namespace mix
