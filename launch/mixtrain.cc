// mixtrain: one worker process of a data-parallel (AMP) training job.
// Start one per device: `mixrun -n 2 -- mixtrain ...` or `mpirun -np 2 mixtrain ...`.
#include "launch/train_config.h"
#include "launch/trainer.h"
#include "launch/worker_main.h"

int main(int argc, char** argv) {
  mix::launch::TrainConfig config;
  // Flags are parsed before MPI starts, so a bad flag exits 2 on every rank at once.
  if (auto code = mix::launch::parse_train_config(argc, argv, config)) return *code;
  // From here a stop signal (a scheduler's preemption) only raises a flag, which
  // the training loop acts on at a step boundary: installed before MPI starts,
  // as Slurm may send its --signal early.
  const mix::launch::StopSignals stop_signals(config.stop_signals);
  return mix::launch::run_worker("mixtrain", [&](mix::collective::Communicator& comm) {
    return mix::launch::run_training(config, comm, stop_signals);
  });
}
