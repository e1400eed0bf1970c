#pragma once
// Deterministic column sums in row chunks: how the rows split, and the second
// pass that adds the chunks' partial sums in order (the first pass is each
// op's own kernel). Like row_group.cuh it needs no CUDA header, so the
// *_emulated tests run it on the CPU; runtime/ops/cuda/device_ops.cuh
// includes it.
#include <algorithm>
#include <cstdint>

#include "runtime/core/half.h"

namespace mix::cuda {

/// FP64 sum step (mean's accumulator).
struct AddRnDouble {
  __device__ double operator()(double a, double b) const { return __dadd_rn(a, b); }
};

/// How a deterministic column sum over `rows` splits into chunks: a first pass
/// adds each chunk's rows in order (threads over columns, blockIdx.y over
/// chunks, so a warp reads adjacent columns), a second (ChunkColumnSum) adds
/// the chunks in order. About `target` rows per chunk, at most `max_chunks`;
/// the split depends on the shape only, never on the GPU.
struct RowChunks {
  int64_t chunks, rows_per_chunk;
};
inline RowChunks row_chunks(int64_t rows, int64_t target, int64_t max_chunks) {
  const int64_t chunks = std::clamp<int64_t>((rows + target - 1) / target, 1, max_chunks);
  return {chunks, (rows + chunks - 1) / chunks};
}

/// The second pass: out[c] = column c's chunk partials (partial is [chunks, cols],
/// Acc float or double) added in chunk order with Add (AddRn, AddRnDouble),
/// rounded once to TOut.
template <typename Acc, typename Add, typename TOut>
struct ChunkColumnSum {
  const Acc* partial;
  TOut* out;
  int64_t chunks, cols;
  __device__ void operator()(int64_t c) const {
    Acc s = 0;
    for (int64_t k = 0; k < chunks; ++k) s = Add{}(s, partial[k * cols + c]);
    out[c] = from_float<TOut>(static_cast<float>(s));
  }
};

}  // namespace mix::cuda
