#include "launch/worker_main.h"

#include <cstdio>
#include <exception>
#include <memory>

#include "collective/consistency.h"
#include "runtime/log.h"

namespace mix::launch {

int run_worker(const char* program, const std::function<int(collective::Communicator&)>& body) {
  std::unique_ptr<collective::Communicator> comm;
  try {
    comm = collective::make_default_communicator();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: cannot start the communicator: %s\n", program, e.what());
    return 1;
  }
  log::init(comm->rank(), comm->world_size());
  try {
    return body(*comm);
  } catch (const collective::CollectiveError& e) {
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

}  // namespace mix::launch
