#pragma once
// The frame of every worker program (mixtrain, mixbench): start the
// communicator (MPI under mpirun, else a single process), set up per-rank
// logging, run the program's body, and turn failures into exit codes without
// leaving other ranks waiting.
#include <functional>

#include "collective/communicator.h"
#include "runtime/core/check.h"

namespace mix::launch {

/// A flag's value that only the model or the job can show to be wrong (a
/// parameter name, a rank beyond the world size). run_worker ends with exit
/// status 2 for it, as for a flag refused while parsing.
class UsageError : public Error {
 public:
  using Error::Error;
};

/// Runs `body` on this rank. Returns body's exit code, or 1 when the
/// communicator cannot start or body throws (2 for a UsageError). A CollectiveError (raised by every
/// rank together) is reported by rank 0 and ends normally; any other exception
/// may be this rank's alone, so the whole job is aborted. When a backend left
/// a thread stuck inside a library (collective::thread_left_in_library), the
/// process ends at once with that code instead of returning.
int run_worker(const char* program, const std::function<int(collective::Communicator&)>& body);

}  // namespace mix::launch
