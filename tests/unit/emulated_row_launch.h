#pragma once
// Launches an emulated row kernel as its launcher does on the GPU: the rows
// of `cols` values go to a warp each up to kWarpRowMax, else to a block each
// (with_row_group, runtime/ops/cuda/row_group.cuh), in blocks of kBlock
// threads; or, `strided`, all through one block, so the grid must stride.
// Include it after every header but the kernels' (cuda_emulation.h defines
// CUDA's keywords as macros).
#include <cstdint>
#include <type_traits>

#include "tests/unit/cuda_emulation.h"

#include "runtime/ops/cuda/row_group.cuh"

namespace mix::testing {

/// kernel(std::integral_constant<int, kThreads>{}) run as a grid of row groups.
template <typename Kernel>
void launch_row_groups(int64_t rows, int64_t cols, bool strided, Kernel kernel) {
  mix::cuda::with_row_group(cols, [&](auto threads) {
    constexpr int kThreads = decltype(threads)::value;
    const unsigned blocks = strided ? 1u : mix::cuda::row_group_blocks<kThreads>(rows);
    emulated::run_grid(
        blocks, 1, [&] { kernel(std::integral_constant<int, kThreads>{}); }, mix::cuda::kBlock);
  });
}

}  // namespace mix::testing
