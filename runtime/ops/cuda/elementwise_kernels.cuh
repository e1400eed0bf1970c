#pragma once
// The kernels of elementwise_add, elementwise_mul and their _grad ops
// (elementwise.cu's header says what they compute), and which of them a shape
// takes. Like row_group.cuh they need no CUDA header, so
// tests/unit/test_elementwise_kernels_emulated.cc runs this same source on
// the CPU.
#include <algorithm>
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/cuda/map_kernels.cuh"
#include "runtime/ops/broadcast.h"
#include "runtime/ops/cuda/kernel_unroll.h"
#include "runtime/ops/cuda/row_group.cuh"

namespace mix::cuda {

// Which Y element X's element i meets, j = (i / post) % n, computed with only
// the divisions the shape needs (a same-shape Y needs none: BinaryMap). An integer division is a sequence of
// instructions on the GPU, not one (a 64-bit one is several times longer than
// a 32-bit one), and at two per element an FP16 add spent more time on index
// arithmetic than on moving its bytes; hence the cases, and 32-bit indices
// wherever every index fits.
enum class YIndex {
  rows,     // post == 1, a bias on rows: j = i % n
  blocks,   // pre == 1, Y on X's leading dims: j = i / post
  general,  // j = (i / post) % n
};

// out[p, j, q] = f(x[p, j, q], y[j]); out may alias x. I: the index type
// (uint32_t where X's elements number at most 2^32 - 1, else int64_t).
//
// In packs of V (launch_packed): a bias on rows whose length n is a multiple
// of V meets V consecutive Y elements, read as a pack too; otherwise, when
// post is a multiple of V, the V elements share one Y element.
template <typename T, typename F, typename I, YIndex kY>
struct BroadcastMap {
  const T* x;
  const T* y;
  T* out;
  I n, post;
  F f;
  __device__ I y_index(int64_t i64) const {
    const I i = static_cast<I>(i64);
    if constexpr (kY == YIndex::rows)
      return i % n;
    else if constexpr (kY == YIndex::blocks)
      return i / post;
    else
      return i / post % n;
  }
  __device__ void operator()(int64_t i) const { out[i] = from_float<T>(f(to_float(x[i]), to_float(y[y_index(i)]))); }
  template <int V>
  __device__ void pack(int64_t i) const {
    const Pack<T, V> xs = load_pack<V>(x, i);
    Pack<T, V> r;
    if constexpr (kY == YIndex::rows) {
      const Pack<T, V> ys = load_pack<V>(y, y_index(i));
      MIX_UNROLL
      for (int k = 0; k < V; ++k) r.v[k] = from_float<T>(f(to_float(xs.v[k]), to_float(ys.v[k])));
    } else {
      const float yj = to_float(y[y_index(i)]);
      MIX_UNROLL
      for (int k = 0; k < V; ++k) r.v[k] = from_float<T>(f(to_float(xs.v[k]), yj));
    }
    store_pack<V>(out, i, r);
  }
  bool packable(int v) const {
    if (!pack_aligned(x, v) || !pack_aligned(out, v)) return false;
    if constexpr (kY == YIndex::rows)
      return n % static_cast<I>(v) == 0 && pack_aligned(y, v);
    else
      return post % static_cast<I>(v) == 0;
  }
};

// The term f(a, b) of column j at (p, q); b may be null (f(a, 0)), as broadcast_reduce.
template <typename T, typename F>
__device__ __forceinline__ float column_term(const T* a, const T* b, const BroadcastDims& d, F f, int64_t j, int64_t p,
                                             int64_t q) {
  const int64_t idx = (p * d.n + j) * d.post + q;
  return f(to_float(a[idx]), b ? to_float(b[idx]) : 0.f);
}

// acc[j] = sum over p, q of f(a, b), one thread per column, in the CPU's order.
template <typename T, typename TOut, typename F>
struct ColumnSumSequential {
  const T* a;
  const T* b;
  TOut* out;
  BroadcastDims d;
  F f;
  __device__ void operator()(int64_t j) const {
    float acc = 0.f;
    for (int64_t p = 0; p < d.pre; ++p)
      for (int64_t q = 0; q < d.post; ++q) acc = __fadd_rn(acc, column_term(a, b, d, f, j, p, q));
    out[j] = from_float<TOut>(acc);
  }
};

// The same sum, one block per column: thread-strided partial sums, then a tree.
template <typename T, typename TOut, typename F>
__global__ void column_sum_tree(const T* a, const T* b, TOut* out, BroadcastDims d, F f) {
  __shared__ float shared[kBlock];
  const int64_t m = d.pre * d.post;
  for (int64_t j = blockIdx.x; j < d.n; j += gridDim.x) {
    float acc = 0.f;
    for (int64_t k = threadIdx.x; k < m; k += kBlock)
      acc = __fadd_rn(acc, column_term(a, b, d, f, j, k / d.post, k % d.post));
    acc = block_reduce(acc, shared, AddRn{});
    if (threadIdx.x == 0) out[j] = from_float<TOut>(acc);
  }
}

// post == 1, the first pass of a row-chunked column sum (device_ops.cuh):
// partial[c, j] = the sum of column j over chunk c's rows (blockIdx.y = c) in
// row order; one thread per column (blockIdx.x tiles them).
template <typename T, typename F>
__global__ void column_chunk_partials(const T* a, const T* b, float* partial, BroadcastDims d, int64_t rows_per_chunk,
                                      F f) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (j >= d.n) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < d.pre ? begin + rows_per_chunk : d.pre;
  float acc = 0.f;
  for (int64_t p = begin; p < end; ++p) acc = __fadd_rn(acc, column_term(a, b, d, f, j, p, 0));
  partial[static_cast<int64_t>(blockIdx.y) * d.n + j] = acc;
}

// ---- which kernels a shape takes ---------------------------------------------------------

/// The BroadcastMap of a broadcast (not same-shape) map: the one that does the fewest divisions.
inline YIndex y_index_kind(const BroadcastDims& d) {
  return d.post == 1 ? YIndex::rows : d.pre == 1 ? YIndex::blocks : YIndex::general;
}

/// Longest column (pre * post terms) reduced by a single thread.
inline constexpr int64_t kColumnSumSequentialMax = 1024;
/// post == 1 columns: rows per chunk (before the cap on the number of chunks).
inline constexpr int64_t kColumnSumRowsPerChunk = 64;
inline constexpr int64_t kColumnSumMaxChunks = 1024;

/// How a Y gradient's column sums run.
enum class ColumnSumPath {
  sequential,  // ColumnSumSequential: a thread a column, in the CPU's order
  row_chunks,  // post == 1: column_chunk_partials, then ChunkColumnSum
  tree,        // column_sum_tree: a block a column
};
inline ColumnSumPath column_sum_path(const BroadcastDims& d) {
  if (d.pre * d.post <= kColumnSumSequentialMax) return ColumnSumPath::sequential;
  return d.post == 1 ? ColumnSumPath::row_chunks : ColumnSumPath::tree;
}

/// Blocks of column_sum_tree (the grid strides over columns past 65535).
inline unsigned column_sum_tree_blocks(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(n, 65535)); }

}  // namespace mix::cuda
