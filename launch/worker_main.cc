#include "launch/worker_main.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include "collective/consistency.h"
#include "launch/launch_environment.h"
#include "runtime/core/log.h"

namespace mix::launch {
namespace {

// Returns `code`, unless a backend left a thread inside a library call
// (collective::thread_left_in_library): then the logs are flushed and the
// process ends here with `code`, skipping the teardown that thread would race.
int finish(int code) {
  if (!collective::thread_left_in_library()) return code;
  spdlog::error("a thread is still stuck in the communication library (see above); ending the process now");
  spdlog::default_logger()->flush();
  std::fflush(nullptr);
  std::_Exit(code);
}

int run_body(collective::Communicator& comm, const std::function<int(collective::Communicator&)>& body) {
  try {
    return body(comm);
  } catch (const collective::CollectiveError& e) {
    // Every rank raised this together: rank 0 reports it, all end normally.
    if (comm.rank() == 0) spdlog::error("{}", e.what());
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    const int code = dynamic_cast<const UsageError*>(&e) ? 2 : 1;
    // Only this rank may have failed: end the whole job so no rank waits forever.
    if (comm.world_size() > 1) comm.abort(code);
    return code;
  }
}

}  // namespace

int run_worker(const char* program, const std::function<int(collective::Communicator&)>& body) {
  std::unique_ptr<collective::Communicator> comm;
  try {
    comm = collective::make_default_communicator();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: cannot start the communicator: %s\n", program, e.what());
    return 1;
  }
  log::init(comm->rank(), comm->world_size());
  // A task that the launcher counted among several but that came up alone
  // would train a model of its own; each such task stops here by itself (there
  // is no job to abort: its world is itself).
  if (auto mismatch = singleton_mismatch(launch_variables(), comm->world_size(), program)) {
    spdlog::error("{}", *mismatch);
    return 2;
  }
  return finish(run_body(*comm, body));
}

}  // namespace mix::launch
