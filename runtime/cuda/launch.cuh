#pragma once
// Grid-stride launches of MIX_HD functors: the CUDA side adds only this launch
// code; the math is the functor the CPU loops also run (runtime/kernels/functors.h).
// The kernels they launch are in map_kernels.cuh.
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/map_kernels.cuh"

namespace mix::cuda {

/// Runs f(i) for i in [0, n) on `stream`; f is a __device__ lambda or functor.
template <typename F>
void launch_grid_stride(int64_t n, cudaStream_t stream, F f) {
  if (n <= 0) return;
  grid_stride_kernel<<<map_blocks(n), kMapThreads, 0, stream>>>(n, f);
  MIX_CUDA_CHECK(cudaGetLastError());
}

/// launch_grid_stride for a map that can also do V elements at once:
/// f.pack<V>(i) does elements i .. i + V - 1 (i a multiple of V), and
/// f.packable(V) says whether its arrays are aligned for that. Where they are
/// not, or n < V, this is launch_grid_stride.
template <int V, typename F>
void launch_packed(int64_t n, cudaStream_t stream, F f) {
  if (n < V || !f.packable(V)) return launch_grid_stride(n, stream, f);
  packed_kernel<V><<<map_blocks(n / V), kMapThreads, 0, stream>>>(n, f);
  MIX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mix::cuda
