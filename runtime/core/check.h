#pragma once
// Checks that throw mix::Error with the failed statement, file:line and the
// process identity (rank and host). One macro per library lives beside that
// library's code (MIX_MPI_CHECK in collective/, MIX_CUDA_CHECK in runtime/cuda/).
#include <sstream>
#include <stdexcept>
#include <string>

namespace mix {

/// Every error mixtrain raises on purpose. The message is meant for a user:
/// it says what went wrong and, where there is one, what to do.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A device ran out of memory; the message has the sizes involved. A caller
/// with a cheaper way to do the same work (a cuDNN algorithm with a smaller
/// workspace) catches it and takes that way.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

/// "rank 1/4 on host-a": set once the communicator knows it (log.cc).
const std::string& process_identity();
void set_process_identity(int rank, int world);

[[noreturn]] void throw_check_failure(const char* what, const char* file, int line, const std::string& detail);

}  // namespace mix

#define MIX_STR_CAT(msg) (static_cast<std::ostringstream&&>(std::ostringstream() << msg)).str()

/// MIX_CHECK(cond, "message " << value): throws mix::Error when cond is false.
#define MIX_CHECK(cond, msg)                                                  \
  do {                                                                        \
    if (!(cond)) ::mix::throw_check_failure(#cond, __FILE__, __LINE__, MIX_STR_CAT(msg)); \
  } while (0)

/// A plain user-facing error (no statement text: the message says it all).
#define MIX_FAIL(msg) throw ::mix::Error(MIX_STR_CAT(msg))
