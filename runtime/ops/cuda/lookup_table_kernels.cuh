#pragma once
// lookup_table's kernels (lookup_table.cu's header comment says what they
// compute): the forward row copy, and lookup_table_grad's steps, the sort's
// keys and positions, every row's start with Accumulate, and the sum of each
// run of equal ids. Like row_group.cuh they need no CUDA header, so
// tests/unit/test_lookup_table_kernels_emulated.cc runs this same source on
// the CPU; the sort between is cub's on the GPU.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/cuda/copy_unit.cuh"
#include "runtime/kernels/functors.h"
#include "runtime/kernels/lookup_row.h"
#include "runtime/ops/cuda/row_group.cuh"

namespace mix::cuda {

// ---- lookup_table ------------------------------------------------------------------------

inline constexpr int kLookupWarpsPerBlock = kBlock / kWarp;

// Out[i] = W[Ids[i]], one warp per id; V is the copy unit (sizeof(V) divides
// the row's bytes and both buffers are aligned to it).
template <typename T, typename L, typename V>
__global__ void lookup_rows(const T* w, const L* ids, T* out, int64_t n, int64_t rows, int64_t d, int64_t padding_idx) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kLookupWarpsPerBlock;
  const int64_t vecs = d * static_cast<int64_t>(sizeof(T)) / static_cast<int64_t>(sizeof(V));
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kLookupWarpsPerBlock + threadIdx.x / kWarp; i < n; i += warps) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    T* o = out + i * d;
    const bool valid = fn::lookup_id_valid(id, rows);
    if (valid && !fn::lookup_is_padding(id, padding_idx)) {
      const V* src = reinterpret_cast<const V*>(w + id * d);
      V* dst = reinterpret_cast<V*>(o);
      for (int64_t j = lane; j < vecs; j += kWarp) dst[j] = src[j];
    } else {
      // The padding row is zeros (fn::lookup_row); a bad id poisons its row (lookup_table.cu says why).
      const T fill = from_float<T>(valid ? 0.f : NAN);
      for (int64_t j = lane; j < d; j += kWarp) o[j] = fill;
    }
  }
}

/// Blocks of lookup_rows for n ids (a warp an id; the grid strides past 65535 blocks).
inline unsigned lookup_row_blocks(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kLookupWarpsPerBlock - 1) / kLookupWarpsPerBlock, 1, 65535));
}

// The widest of 16, 8, 4, 2 bytes that divides `row_bytes` and aligns both pointers.
inline int lookup_copy_unit(size_t row_bytes, const void* a, const void* b) {
  return static_cast<int>(widest_copy_unit(row_bytes, a, b, [](size_t) { return true; }));
}

// ---- lookup_table_grad -------------------------------------------------------------------

// Sort input: the id as key (`none` when it takes no gradient), the position as value.
template <typename L>
struct GradKeys {
  const L* ids;
  uint32_t* keys;
  int32_t* pos;
  int64_t rows, padding_idx;
  __device__ void operator()(int64_t i) const {
    const int64_t id = static_cast<int64_t>(ids[i]);
    const bool takes = fn::lookup_id_valid(id, rows) && !fn::lookup_is_padding(id, padding_idx);
    keys[i] = takes ? static_cast<uint32_t>(id) : static_cast<uint32_t>(rows);
    pos[i] = static_cast<int32_t>(i);
  }
};

// One block per run of equal sorted keys (the block whose index starts the
// run does the work), threads over the columns: dw[id, c] = sum over the
// run's positions p, ascending, of dout[p, c], in FP32.
// With `other` (input Accumulate, of type TA; else null) the gradient's other
// part is added to each sum (fn::add_grad_part).
template <typename T, typename TA>
__global__ void lookup_grad_runs(const uint32_t* keys, const int32_t* pos, const T* dout, const TA* other, T* dw,
                                 int64_t n, uint32_t none, int64_t d) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const uint32_t k = keys[i];
    if (k == none || (i > 0 && keys[i - 1] == k)) continue;  // the same for the whole block
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      float acc = 0.f;
      for (int64_t j = i; j < n && keys[j] == k; ++j)
        acc = __fadd_rn(acc, to_float(dout[static_cast<int64_t>(pos[j]) * d + c]));
      const int64_t at = static_cast<int64_t>(k) * d + c;
      dw[at] = other ? fn::add_grad_part<T>(acc, to_float(other[at])) : from_float<T>(acc);
    }
  }
}

// Step 0 with Accumulate: every row of dw is the other part plus a zero sum,
// the value of the rows no id names (the runs overwrite the others).
template <typename T, typename TA>
struct OtherPartOnly {
  const TA* other;
  T* dw;
  __device__ void operator()(int64_t i) const { dw[i] = fn::add_grad_part<T>(0.f, to_float(other[i])); }
};

/// Threads of a run's block: the columns rounded up to whole warps, at most kBlock.
inline int grad_run_threads(int64_t d) {
  return static_cast<int>(std::clamp<int64_t>((d + kWarp - 1) / kWarp * kWarp, kWarp, kBlock));
}

}  // namespace mix::cuda
