// run_worker (launch/worker_main.h), the frame of mixtrain and mixbench, in a
// single process (the local communicator): the body's exit code comes back,
// an exception becomes exit code 1, and once a backend has left a thread
// stuck inside a library (collective::note_thread_left_in_library, which the
// NCCL backend calls when ncclCommAbort outlasts its timeout) the process ends
// at once with the code, skipping the exit-time teardown that would race the
// thread. Those cases run in a forked child, whose exit status tells which way
// it ended.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <stdexcept>

#include "collective/communicator.h"
#include "launch/worker_main.h"

using namespace mix;

namespace {

// Runs run_worker(body) in a child that then calls std::exit with its result,
// with an atexit handler that turns any normal exit into status 99. Returns
// the child's exit status: the code itself only when the process ended
// without exit-time teardown.
int exit_status_of_child(bool thread_left, const std::function<int(collective::Communicator&)>& body) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (thread_left) collective::note_thread_left_in_library();
    std::atexit([] { std::_Exit(99); });
    std::exit(launch::run_worker("test_worker_main", body));
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

}  // namespace

TEST_CASE("run_worker returns the body's code, and 1 for an exception", "[launch]") {
  CHECK(launch::run_worker("test_worker_main", [](collective::Communicator& comm) {
          CHECK(comm.world_size() == 1);
          return 3;
        }) == 3);
  CHECK(launch::run_worker("test_worker_main",
                           [](collective::Communicator&) -> int { throw std::runtime_error("the body failed"); }) == 1);
  CHECK_FALSE(collective::thread_left_in_library());
}

TEST_CASE("run_worker ends the process at once when a thread was left in a library", "[launch]") {
  // Without the flag the child exits normally: the atexit handler runs (99).
  CHECK(exit_status_of_child(false, [](collective::Communicator&) { return 5; }) == 99);
  // With it, run_worker ends the process with the body's code, no teardown.
  CHECK(exit_status_of_child(true, [](collective::Communicator&) { return 5; }) == 5);
  CHECK(exit_status_of_child(
            true, [](collective::Communicator&) -> int { throw std::runtime_error("NCCL all_reduce failed"); }) == 1);
}
