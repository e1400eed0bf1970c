#pragma once
// MIX_NCCL_CHECK(stmt): runs an NCCL call and throws mix::Error with the call,
// file:line, NCCL's error string, NCCL's last-error text (which usually names
// the failing transport or CUDA call) and the process identity when it does
// not return ncclSuccess. MIX_NCCL_CHECK_NOTHROW(stmt) is the twin for
// destructors: it reports to stderr.
//
// ncclInProgress counts as a failure here: calls on a non-blocking
// communicator that may return it are handled by the communicator's own
// polling code (nccl_communicator.cu), not by these macros.
#include <nccl.h>

#include <cstdio>
#include <string>

#include "runtime/core/check.h"

namespace mix::collective {

/// "NCCL error: <string for rc> (<NCCL's last error text>)" and a hint for the
/// codes whose cause is usually elsewhere (another rank, the network, CUDA).
inline std::string nccl_error_text(ncclResult_t rc, ncclComm_t comm = nullptr) {
  std::string msg = "NCCL error: ";
  const char* s = ncclGetErrorString(rc);
  msg += s ? s : ("code " + std::to_string(static_cast<int>(rc)));
  // The comm argument is unused by current NCCL versions; the text is NCCL's
  // last error in this process (any thread, its own included) and may belong
  // to an earlier asynchronous failure.
  const char* last = ncclGetLastError(comm);
  if (last && *last) {
    msg += " (";
    msg += last;
    msg += ")";
  }
  switch (rc) {
    case ncclRemoteError:
      msg += "; another rank failed or exited, or a network peer went away: look at the other ranks' logs";
      break;
    case ncclSystemError:
      msg += "; a system call or the network failed (check NCCL_SOCKET_IFNAME, InfiniBand, firewalls, /dev/shm size)";
      break;
    case ncclUnhandledCudaError:
      msg += "; a CUDA call inside NCCL failed (a bad device pointer, a sticky CUDA error from an earlier kernel)";
      break;
    case ncclInvalidUsage:
    case ncclInvalidArgument:
      msg += "; NCCL was called wrongly (a host pointer, a wrong device, a rank out of range)";
      break;
    default:
      break;
  }
  msg += "; rerun with NCCL_DEBUG=INFO for NCCL's own account";
  return msg;
}

[[noreturn]] inline void throw_nccl_failure(const char* stmt, const char* file, int line, ncclResult_t rc) {
  ::mix::throw_check_failure(stmt, file, line, nccl_error_text(rc));
}

inline void report_nccl_failure(const char* stmt, const char* file, int line, ncclResult_t rc) noexcept {
  try {
    std::fprintf(stderr, "mixtrain: %s [%s at %s:%d, %s]\n", nccl_error_text(rc).c_str(), stmt, file, line,
                 ::mix::process_identity().c_str());
  } catch (...) {
    std::fprintf(stderr, "mixtrain: NCCL call failed (code %d) [%s at %s:%d]\n", static_cast<int>(rc), stmt, file,
                 line);
  }
}

}  // namespace mix::collective

#define MIX_NCCL_CHECK(stmt)                                                                 \
  do {                                                                                       \
    const ncclResult_t mix_nccl_rc_ = (stmt);                                                \
    if (mix_nccl_rc_ != ncclSuccess)                                                         \
      ::mix::collective::throw_nccl_failure(#stmt, __FILE__, __LINE__, mix_nccl_rc_);        \
  } while (0)

#define MIX_NCCL_CHECK_NOTHROW(stmt)                                                         \
  do {                                                                                       \
    const ncclResult_t mix_nccl_rc_ = (stmt);                                                \
    if (mix_nccl_rc_ != ncclSuccess)                                                         \
      ::mix::collective::report_nccl_failure(#stmt, __FILE__, __LINE__, mix_nccl_rc_);       \
  } while (0)
