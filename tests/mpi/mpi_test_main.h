#pragma once
// The main() of a Catch2 test run under mpirun: start the MPI communicator,
// run the tests on every rank, and fail every rank if any rank failed (the
// failure counts are combined with MAX), so CTest sees one verdict.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <memory>

#include "collective/communicator.h"

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
  int32_t failed = Catch::Session().run(argc, argv);
  try {
    owner->all_reduce(&failed, 1, DType::i32, collective::ReduceOp::max);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: final all-reduce failed: %s\n", name, e.what());
    failed = 1;
  }
  comm = nullptr;
  owner.reset();  // MPI_Finalize
  return failed != 0 ? 1 : 0;
}

}  // namespace mix::testing
