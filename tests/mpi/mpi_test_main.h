#pragma once
// The main() of a Catch2 test run under mpirun: start the MPI communicator,
// run the tests on every rank, and fail every rank if any rank failed (the
// failure counts are combined with MAX), so CTest sees one verdict. A part
// skipped on any rank (tests/skip_part.h) makes every rank exit 77 when
// nothing failed; mpirun passes 77 through when every rank returns it.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <memory>

#include "collective/communicator.h"
#include "tests/skip_part.h"

namespace mix::testing {

/// Runs the tests with `comm` pointing at the MPI communicator meanwhile.
inline int run_mpi_tests(int argc, char** argv, const char* name, collective::Communicator*& comm) {
  std::unique_ptr<collective::Communicator> owner;
  try {
    owner = collective::make_mpi_communicator();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: cannot start MPI: %s\n", name, e.what());
    return 1;
  }
  comm = owner.get();
  // [0]: failed, [1]: skipped something; MAX over the ranks, so every rank
  // returns the same code.
  int32_t outcome[2] = {Catch::Session().run(argc, argv), skipped_parts().empty() ? 0 : 1};
  try {
    owner->all_reduce(outcome, 2, DType::i32, collective::ReduceOp::max);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: final all-reduce failed: %s\n", name, e.what());
    outcome[0] = 1;
  }
  comm = nullptr;
  owner.reset();  // MPI_Finalize
  return exit_code(outcome[0], outcome[1] != 0);
}

}  // namespace mix::testing
