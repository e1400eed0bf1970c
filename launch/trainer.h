#pragma once
#include "collective/communicator.h"
#include "launch/stop_signals.h"
#include "launch/train_config.h"

namespace mix::launch {

/// Runs one rank's part of a training job. Returns the process exit code
/// (kStoppedExitCode after `stop_signals` stopped it); throws mix::Error (or
/// collective::CollectiveError) on failure.
int run_training(const TrainConfig& config, collective::Communicator& comm, const StopSignals& stop_signals);

}  // namespace mix::launch
