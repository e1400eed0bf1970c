#pragma once
// One step of mixtrain's training loop: through --cuda-graph's recording
// when there is one (runtime/exec/step_graph.h), else op by op; and what happens
// when CUDA refuses to record it. Kept out of trainer.cc so that the fallback
// can be tested on the CPU with a stand-in recording (test_step_graph).
#include <cstdint>
#include <memory>

#include "runtime/exec/executor.h"
#include "runtime/exec/step_graph.h"

namespace mix::launch {

/// How run_training_step ran the step.
struct StepRun {
  StepGraph::Ran ran = StepGraph::Ran::eager;
  /// The recording was refused and the step then ran op by op.
  bool fell_back = false;
  /// Gradient all-reduce bytes env.comm counted for the refused recording's
  /// collectives, which it started but never ran; the step's own bytes are
  /// the counter's growth less these.
  uint64_t refused_recording_bytes = 0;
  /// Seconds the refused recording took (its host code runs in full before
  /// CUDA says no); the step's own time is the call's time less these, so the
  /// metrics' step_ms is that of the op-by-op step that did the work.
  double refused_recording_seconds = 0;
};

/// Runs one training step through `graph` (it decides: op by op, recorded or
/// replayed) or, without one, op by op with `step`.
///
/// A recording refused (RecordingError) ran none of the step's device work.
/// With one rank (world == 1) this logs CUDA's reason, gives up the
/// all-reduces the recording started (collective::forget_started), resets
/// `graph` so that this and every later step run op by op, and runs the step
/// op by op. With several ranks it throws Error instead: the other ranks may
/// have recorded their collectives, and one rank queueing its own op by op
/// against their replays has never been tried.
StepRun run_training_step(std::unique_ptr<StepGraph>& graph, Executor& step, Scope& scope, ExecEnv& env, int world);

}  // namespace mix::launch
