#pragma once
// Rows and reductions shared by a group of threads, a warp or a block: the
// block size, the deterministic warp and block reductions, and RowGroup, which
// gives a row to a warp or to a whole block. The row kernels (layer_norm,
// softmax, cross-entropy, fused_attention) and the column sums build on them.
//
// No CUDA header here: what this needs (threadIdx, __shfl_xor_sync,
// __syncthreads, __fadd_rn) is nvcc's in a .cu file, or the emulation's
// (tests/unit/cuda_emulation.h), which runs this same code on the CPU for the
// *_emulated tests. runtime/ops/cuda/device_ops.cuh includes it.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "runtime/kernels/softmax_row.h"  // fn::max_of

namespace mix::cuda {

/// Threads per block of the row and reduction kernels (block_reduce assumes it).
inline constexpr int kBlock = 256;
inline constexpr int kWarp = 32;

/// FP32 sum step, never contracted into an FMA (device_ops.cuh's header says why).
struct AddRn {
  __device__ float operator()(float a, float b) const { return __fadd_rn(a, b); }
};
/// The max step of softmax rows, fn::max_of (NaN never wins, as on the CPU).
struct MaxOf {
  __device__ float operator()(float a, float b) const { return fn::max_of(a, b); }
};

/// Reduces one value per lane over a warp with a butterfly of log2(32) = 5
/// levels (register shuffles, no barrier); every lane gets the same result.
/// All 32 lanes must call it.
template <typename V, typename Op>
__device__ V warp_reduce(V v, Op op) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Reduces one value per thread over a block of kBlock threads with a fixed
/// tree of log2(kBlock) = 8 levels; every thread gets the same result.
/// `shared` holds kBlock / kWarp values. All threads of the block must call
/// it (it synchronises).
///
/// Levels 1-5 are a butterfly inside each warp (register shuffles), levels
/// 6-8 a pairing tree over the 8 warps' values that every thread computes
/// alike from shared memory: two barriers in all. (A tree through shared
/// memory alone took a barrier per level, 9 in all, and the barriers, not the
/// bytes, set the pace of a 256-column softmax row.) The depth, and so the
/// error bound of a sum, (per-thread terms + 8)·u·sum|terms|, is the same.
template <typename V, typename Op>
__device__ V block_reduce(V v, V* shared, Op op) {
  constexpr int kWarps = kBlock / kWarp;
  static_assert(kBlock % kWarp == 0 && (kWarps & (kWarps - 1)) == 0, "whole warps, a power of two of them");
  v = warp_reduce(v, op);
  if (threadIdx.x % kWarp == 0) shared[threadIdx.x / kWarp] = v;  // lane 0's value stands for its warp
  __syncthreads();
  V w[kWarps];
  for (int k = 0; k < kWarps; ++k) w[k] = shared[k];
  for (int s = kWarps / 2; s > 0; s >>= 1)
    for (int k = 0; k < s; ++k) w[k] = op(w[k], w[k + s]);
  __syncthreads();  // the caller may reuse `shared` right away
  return w[0];
}

// ---- rows shared by a group of threads ------------------------------------------------

/// Rows of up to this many values go to one warp each, longer ones to a block
/// each: a block would leave most of its threads idle on a short row and make
/// them all wait at its barriers.
inline constexpr int64_t kWarpRowMax = 1024;

/// kThreads threads (a warp, or the whole block of kBlock) own one row; a
/// block holds kRowsPerBlock groups, and the grid strides over rows.
template <int kThreads>
struct RowGroup {
  static_assert(kThreads == kWarp || kThreads == kBlock, "a warp or a block");
  static constexpr int kRowsPerBlock = kBlock / kThreads;
  /// The thread's place in its group.
  __device__ static int tid() { return static_cast<int>(threadIdx.x) % kThreads; }
  __device__ static int64_t first_row() {
    return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + static_cast<int>(threadIdx.x) / kThreads;
  }
  __device__ static int64_t row_stride() { return static_cast<int64_t>(gridDim.x) * kRowsPerBlock; }

  /// warp_reduce or block_reduce: the same value in every thread of the group
  /// (the same bits for a sum, whose adds commute exactly; a warp's max may
  /// differ between lanes in the sign of a zero, which x - max cannot show).
  /// All threads of the group call it (every thread of a warp has the same
  /// row, so a warp's shuffles always have all 32 lanes); `shared` holds
  /// kBlock / kWarp values.
  template <typename V, typename Op>
  __device__ static V reduce(V v, V* shared, Op op) {
    if constexpr (kThreads == kWarp)
      return warp_reduce(v, op);
    else
      return block_reduce(v, shared, op);
  }
};

/// Blocks for `rows` rows at RowGroup<kThreads>::kRowsPerBlock rows each.
template <int kThreads>
unsigned row_group_blocks(int64_t rows) {
  constexpr int64_t per = RowGroup<kThreads>::kRowsPerBlock;
  return static_cast<unsigned>(std::clamp<int64_t>((rows + per - 1) / per, 1, 65535));
}

/// f(std::integral_constant<int, kThreads>{}) with the group size for rows of
/// `cols` values: kWarp up to kWarpRowMax, else kBlock. A row kernel's
/// launcher then launches kernel<T, kThreads> once, for either size.
template <typename F>
void with_row_group(int64_t cols, F&& f) {
  if (cols <= kWarpRowMax)
    f(std::integral_constant<int, kWarp>{});
  else
    f(std::integral_constant<int, kBlock>{});
}

}  // namespace mix::cuda
