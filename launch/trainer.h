#pragma once
#include "collective/communicator.h"
#include "launch/train_config.h"

namespace mix::launch {

/// Runs one rank's part of a training job. Returns the process exit code;
/// throws mix::Error (or collective::CollectiveError) on failure.
int run_training(const TrainConfig& config, collective::Communicator& comm);

}  // namespace mix::launch
