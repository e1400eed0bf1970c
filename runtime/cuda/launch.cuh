#pragma once
// Grid-stride launches of MIX_HD functors: the CUDA side adds only this launch
// code; the math is the functor the CPU loops also run (runtime/kernels/functors.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "runtime/cuda/cuda_check.h"

namespace mix::cuda {

template <typename F>
__global__ void grid_stride_kernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    f(i);
}

/// Runs f(i) for i in [0, n) on `stream`; f is a __device__ lambda or functor.
template <typename F>
void launch_grid_stride(int64_t n, cudaStream_t stream, F f) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65535);
  grid_stride_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(n, f);
  MIX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mix::cuda
