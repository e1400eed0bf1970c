#include "launch/step_runner.h"

#include <chrono>
#include <string>

#include "collective/allreduce_bucket.h"
#include "collective/communicator.h"
#include "runtime/core/check.h"
#include "runtime/core/log.h"

namespace mix::launch {

namespace {

uint64_t grad_bytes_so_far(const ExecEnv& env) { return env.comm ? env.comm->bytes().grad_allreduce_bytes : 0; }

}  // namespace

StepRun run_training_step(std::unique_ptr<StepGraph>& graph, Executor& step, Scope& scope, ExecEnv& env, int world) {
  StepRun run;
  if (!graph) {
    step.run(scope, env);
    return run;
  }
  const uint64_t bytes_before = grad_bytes_so_far(env);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run.ran = graph->run(scope, env);
    return run;
  } catch (const RecordingError& e) {
    if (world > 1)
      throw Error(std::string(e.what()) + ". With several ranks a failed recording stops the job (one rank " +
                  "cannot fall back to op-by-op steps alone): run without --cuda-graph");
    spdlog::warn("--cuda-graph: {}; this step and every later one run op by op, as without --cuda-graph", e.what());
  }
  collective::forget_started(env);
  graph.reset();
  run.fell_back = true;
  run.refused_recording_bytes = grad_bytes_so_far(env) - bytes_before;
  run.refused_recording_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  step.run(scope, env);
  return run;
}

}  // namespace mix::launch
