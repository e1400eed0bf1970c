#pragma once
// MIX_CUDA_CHECK: throws mix::Error with the statement, file:line, the CUDA
// error string and the process identity. MIX_CUDA_CHECK_NOTHROW logs instead
// (for destructors, which must not throw).
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "runtime/core/check.h"

#define MIX_CUDA_CHECK(stmt)                                                                           \
  do {                                                                                                 \
    const cudaError_t mix_cuda_err_ = (stmt);                                                          \
    if (mix_cuda_err_ != cudaSuccess)                                                                  \
      ::mix::throw_check_failure(#stmt, __FILE__, __LINE__,                                            \
                                 std::string("CUDA error: ") + cudaGetErrorString(mix_cuda_err_));     \
  } while (0)

#define MIX_CUDA_CHECK_NOTHROW(stmt)                                                                   \
  do {                                                                                                 \
    const cudaError_t mix_cuda_err_ = (stmt);                                                          \
    if (mix_cuda_err_ != cudaSuccess)                                                                  \
      std::fprintf(stderr, "%s failed at %s:%d: %s (%s)\n", #stmt, __FILE__, __LINE__,                 \
                   cudaGetErrorString(mix_cuda_err_), ::mix::process_identity().c_str());              \
  } while (0)
