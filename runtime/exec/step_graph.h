#pragma once
// --cuda-graph: a training step queued on the device as one recorded graph
// (DeviceGraph, runtime/core/device_backend.h) instead of op by op. Op by op,
// the host makes one call per kernel (cuDNN's cost the most), and for a
// ResNet-50 AMP step it can take longer to queue the step than the GPU takes
// to run it (docs/gpu.md has the measurements). A replay queues the whole step
// with one call.
//
// What a recording freezes, and how this class keeps it right:
// - Addresses. Inputs (the feeds) are copied into buffers of the recording's
//   own before each replay. Every other non-persistable variable is dropped
//   from the scope before recording, so the recorded step allocates it from
//   the recording's pool, which nothing else is handed. Persistable variables
//   (parameters, optimizer and scaler state) must stay where they were
//   recorded: each run checks, and records again when one has moved.
// - Shapes. A step whose feeds have other shapes (an epoch's partial last
//   batch) runs op by op.
// - Host values. The step's data-dependent decisions (skipping an overflowed
//   step, the loss scale, the learning rate) are read from device memory by
//   the kernels, so they replay correctly. So is the step number, for the ops
//   whose work depends on it (OpInfo::varies_by_step: dropout's mask key,
//   inject_overflow): while recording, ExecEnv::device_step points at a
//   buffer of this class's own, which it writes before each replay.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/device_backend.h"
#include "runtime/exec/executor.h"

namespace mix {

class StepGraph {
 public:
  enum class Ran { eager, recorded, replayed };

  /// `step` runs `program`; both must outlive this. `feeds`: the variables
  /// the caller sets before each run (a batch's inputs and labels). `outputs`:
  /// those the caller reads after a run (`step`'s kept ones; absent ones are
  /// skipped), put back into the scope after each replay. `graph`: an empty
  /// recording of the device (DeviceBackend::make_graph).
  StepGraph(const Program& program, const Executor& step, std::vector<std::string> feeds,
            std::vector<std::string> outputs, std::unique_ptr<DeviceGraph> graph);

  /// Why steps of `program` under `env` cannot be recorded once and replayed
  /// (the CPU, MIX_PROFILE_OPS, an op that waits on the host for the device:
  /// OpInfo::host_waits); empty when they can. Ops that depend on the step
  /// are recorded too: they read it through ExecEnv::device_step.
  static std::string why_not(const Program& program, const ExecEnv& env);

  /// Runs one step over `scope`. Steps run op by op until one has the feed
  /// shapes of the run before it: what that run cached (algorithm choices,
  /// lazily loaded kernels, allocator blocks, plans) is then in place, and the
  /// recording is of the usual batch, not of an epoch's short last one. That
  /// step is recorded and replayed; later ones of its shapes replay, others
  /// run op by op. The result is the eager step's, bit for bit. A recording
  /// that fails throws RecordingError saying why. None of the step's device
  /// work ran; the scope is as the step found it, less its temporaries (its
  /// feeds are the caller's again). The all-reduces it started before failing
  /// are still in env.in_flight: after collective::forget_started, the caller
  /// may run the same step op by op (mixtrain does with one rank). Host-side
  /// caches the recorded ops filled (algorithm choices, plans) stay.
  Ran run(Scope& scope, ExecEnv& env);

 private:
  struct Placed {
    std::string name;
    const void* where;
  };
  using FeedShapes = std::vector<std::pair<Shape, DType>>;
  FeedShapes feed_shapes(const Scope& scope) const;
  bool feeds_match(const Scope& scope) const;
  bool persistables_in_place(const Scope& scope) const;
  void record(Scope& scope, ExecEnv& env);
  void replay(Scope& scope, const ExecEnv& env);

  const Program& program_;
  const Executor& step_;
  std::vector<std::string> feed_names_, output_names_;
  std::unique_ptr<DeviceGraph> graph_;
  FeedShapes last_run_feeds_;  // the feeds' shapes at the last run (none before the first)
  bool recorded_ = false;
  bool needs_step_ = false;                              // some op varies by step: keep device_step_ current
  Tensor device_step_;                                   // i64 [1] on the device: ExecEnv::device_step of the recording
  std::vector<Tensor> feed_buffers_;                     // what the recording reads the feeds from
  std::vector<std::pair<std::string, Tensor>> outputs_;  // what the recording writes the outputs to
  std::vector<Placed> persistables_;                     // where the recording reads and writes them
};

}  // namespace mix
