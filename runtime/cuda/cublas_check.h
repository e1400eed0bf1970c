#pragma once
// MIX_CUBLAS_CHECK: throws mix::Error with the statement, file:line, the cuBLAS
// status name and its description, and the process identity (rank and host).
// MIX_CUBLAS_CHECK_NOTHROW prints the same to stderr instead, allocating nothing
// (for destructors, which must not throw).
#include <cublas_v2.h>

#include <cstdio>
#include <string>

#include "runtime/core/check.h"

namespace mix::cuda {

/// "CUBLAS_STATUS_INVALID_VALUE (an invalid value was used as an argument)".
inline std::string cublas_status_text(cublasStatus_t status) {
  std::string s = cublasGetStatusName(status);
  s += " (";
  s += cublasGetStatusString(status);
  s += ")";
  return s;
}

}  // namespace mix::cuda

#define MIX_CUBLAS_CHECK(stmt)                                                                         \
  do {                                                                                                 \
    const cublasStatus_t mix_cublas_status_ = (stmt);                                                  \
    if (mix_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                                   \
      ::mix::throw_check_failure(#stmt, __FILE__, __LINE__,                                            \
                                 "cuBLAS error: " + ::mix::cuda::cublas_status_text(mix_cublas_status_)); \
  } while (0)

#define MIX_CUBLAS_CHECK_NOTHROW(stmt)                                                                 \
  do {                                                                                                 \
    const cublasStatus_t mix_cublas_status_ = (stmt);                                                  \
    if (mix_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                                   \
      std::fprintf(stderr, "%s failed at %s:%d: cuBLAS error: %s (%s) (%s)\n", #stmt, __FILE__,        \
                   __LINE__, cublasGetStatusName(mix_cublas_status_),                                  \
                   cublasGetStatusString(mix_cublas_status_), ::mix::process_identity().c_str());      \
  } while (0)
