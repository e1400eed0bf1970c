// mixtrain: one worker process of a data-parallel (AMP) training job.
// Start one per device: `mixrun -n 2 -- mixtrain ...` or `mpirun -np 2 mixtrain ...`.
#include <cstdio>
#include <exception>

#include "collective/consistency.h"
#include "launch/train_config.h"
#include "launch/trainer.h"
#include "runtime/log.h"

int main(int argc, char** argv) {
  mix::launch::TrainConfig config;
  // Flags are parsed before MPI starts, so a bad flag exits 2 on every rank at once.
  if (auto code = mix::launch::parse_train_config(argc, argv, config)) return *code;

  std::unique_ptr<mix::collective::Communicator> comm;
  try {
    comm = mix::collective::make_default_communicator();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mixtrain: cannot start the communicator: %s\n", e.what());
    return 1;
  }
  mix::log::init(comm->rank(), comm->world_size());
  try {
    return mix::launch::run_training(config, *comm);
  } catch (const mix::collective::CollectiveError& e) {
    // Every rank raised this together: rank 0 reports it, all end normally.
    if (comm->rank() == 0) spdlog::error("{}", e.what());
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    // Only this rank may have failed: end the whole job so no rank waits forever.
    if (comm->world_size() > 1) comm->abort(1);
    return 1;
  }
}
