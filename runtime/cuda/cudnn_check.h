#pragma once
// MIX_CUDNN_CHECK: throws mix::Error with the statement, file:line, the cuDNN
// status name, cuDNN's last error message (cuDNN 9 keeps one per thread; it
// usually names the offending argument, which the status alone does not), and
// the process identity (rank and host). MIX_CUDNN_CHECK_NOTHROW
// prints the status to stderr instead, allocating nothing (for destructors,
// which must not throw).
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdio>
#include <string>

#include "runtime/core/check.h"

namespace mix::cuda {

/// "CUDNN_STATUS_BAD_PARAM (cuDNN's last message: ...)".
inline std::string cudnn_status_text(cudnnStatus_t status) {
  std::string s = cudnnGetErrorString(status);
  char last[512] = {};
  cudnnGetLastErrorString(last, sizeof(last));
  if (last[0] != '\0') {
    s += " (cuDNN's last message: ";
    s += last;
    s += ")";
  }
  return s;
}

/// Reads (and so drops) cuDNN's last error message after refusals that are
/// expected, e.g. while probing which algorithms can run, so that a later
/// failure does not report them. Also drops the CUDA runtime's last error, in
/// case a refused algorithm left one from a launch of its own: the next
/// kernel's cudaGetLastError() check would otherwise blame that kernel. (A
/// sticky error, a broken context, stays: every later call reports it.)
inline void discard_cudnn_last_error() {
  char last[512];
  cudnnGetLastErrorString(last, sizeof(last));
  (void)cudaGetLastError();
}

}  // namespace mix::cuda

#define MIX_CUDNN_CHECK(stmt)                                                                          \
  do {                                                                                                 \
    const cudnnStatus_t mix_cudnn_status_ = (stmt);                                                    \
    if (mix_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                                     \
      ::mix::throw_check_failure(#stmt, __FILE__, __LINE__,                                            \
                                 "cuDNN error: " + ::mix::cuda::cudnn_status_text(mix_cudnn_status_)); \
  } while (0)

#define MIX_CUDNN_CHECK_NOTHROW(stmt)                                                                  \
  do {                                                                                                 \
    const cudnnStatus_t mix_cudnn_status_ = (stmt);                                                    \
    if (mix_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                                     \
      std::fprintf(stderr, "%s failed at %s:%d: cuDNN error: %s (%s)\n", #stmt, __FILE__, __LINE__,     \
                   cudnnGetErrorString(mix_cudnn_status_), ::mix::process_identity().c_str());         \
  } while (0)
