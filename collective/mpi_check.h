#pragma once
// MIX_MPI_CHECK(stmt): runs an MPI call and throws mix::Error with the call,
// file:line, MPI's own error string and the process identity when it does not
// return MPI_SUCCESS. MPI calls return errors only on a communicator set to
// MPI_ERRORS_RETURN, which the MPI communicator does for MPI_COMM_WORLD.
// MIX_MPI_CHECK_NOTHROW(stmt) is the twin for destructors: it reports to stderr.
// Only the C API: the deprecated C++ bindings do not compile warning-free and
// would need libmpi_cxx.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstdio>
#include <string>

#include "runtime/core/check.h"

namespace mix::collective {

inline std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS || len <= 0) return "MPI error code " + std::to_string(rc);
  return std::string(text, static_cast<size_t>(len));
}

[[noreturn]] inline void throw_mpi_failure(const char* stmt, const char* file, int line, int rc) {
  ::mix::throw_check_failure(stmt, file, line, "MPI call failed: " + mpi_error_string(rc));
}

inline void report_mpi_failure(const char* stmt, const char* file, int line, int rc) noexcept {
  try {
    std::fprintf(stderr, "mixtrain: MPI call failed: %s [%s at %s:%d, %s]\n", mpi_error_string(rc).c_str(), stmt, file,
                 line, ::mix::process_identity().c_str());
  } catch (...) {
    std::fprintf(stderr, "mixtrain: MPI call failed (code %d) [%s at %s:%d]\n", rc, stmt, file, line);
  }
}

}  // namespace mix::collective

#define MIX_MPI_CHECK(stmt)                                                                  \
  do {                                                                                       \
    const int mix_mpi_rc_ = (stmt);                                                          \
    if (mix_mpi_rc_ != MPI_SUCCESS)                                                          \
      ::mix::collective::throw_mpi_failure(#stmt, __FILE__, __LINE__, mix_mpi_rc_);          \
  } while (0)

#define MIX_MPI_CHECK_NOTHROW(stmt)                                                          \
  do {                                                                                       \
    const int mix_mpi_rc_ = (stmt);                                                          \
    if (mix_mpi_rc_ != MPI_SUCCESS)                                                          \
      ::mix::collective::report_mpi_failure(#stmt, __FILE__, __LINE__, mix_mpi_rc_);         \
  } while (0)
