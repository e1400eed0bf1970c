#pragma once
// Launches emulated elementwise maps as runtime/cuda/launch.cuh launches them
// on the GPU: launch_grid_stride's grid of map_blocks(n) blocks of
// kMapThreads, and launch_packed's packs of V where the map's arrays allow,
// else the grid-stride launch. Include it after every header but the
// kernels' (cuda_emulation.h defines CUDA's keywords as macros).
#include <cstdint>

#include "tests/unit/cuda_emulation.h"

#include "runtime/cuda/map_kernels.cuh"

namespace mix::testing {

/// f(i) for i in [0, n), as launch_grid_stride runs it.
template <typename F>
void emulated_grid_stride(int64_t n, F f) {
  if (n <= 0) return;
  emulated::run_grid(
      mix::cuda::map_blocks(n), 1, [&] { mix::cuda::grid_stride_kernel(n, f); }, mix::cuda::kMapThreads);
}

/// The map f over [0, n), as launch_packed<V> runs it. Returns whether it ran in packs.
template <int V, typename F>
bool emulated_packed(int64_t n, F f) {
  if (n < V || !f.packable(V)) {
    emulated_grid_stride(n, f);
    return false;
  }
  emulated::run_grid(
      mix::cuda::map_blocks(n / V), 1, [&] { mix::cuda::packed_kernel<V>(n, f); }, mix::cuda::kMapThreads);
  return true;
}

}  // namespace mix::testing
