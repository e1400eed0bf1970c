#pragma once
// top1_correct's kernel (top1_correct.cu's header says what it computes).
// Like row_group.cuh it needs no CUDA header, so
// tests/unit/test_top1_correct_kernels_emulated.cc runs this same source on
// the CPU.
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/kernels/argmax_key.h"
#include "runtime/ops/cuda/row_group.cuh"

namespace mix::cuda {

/// The larger of two argmax keys (fn::argmax_key).
struct MaxKey {
  __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const { return a > b ? a : b; }
};

/// A block per row (the grid strides over rows): *correct gains one for each
/// row whose largest key over its first `valid` of `classes` columns is its
/// label's. *correct must start at 0.
template <typename T, typename L>
__global__ void top1_correct_rows(const T* logits, const L* label, int64_t rows, int64_t classes, int64_t valid,
                                  unsigned long long* correct) {
  __shared__ unsigned long long shared[kBlock / kWarp];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = logits + r * classes;
    unsigned long long best = 0;  // below every key, as on the CPU
    for (int64_t j = threadIdx.x; j < valid; j += kBlock) {
      const unsigned long long key = fn::argmax_key(to_float(row[j]), j);
      best = key > best ? key : best;
    }
    best = block_reduce(best, shared, MaxKey{});
    if (threadIdx.x == 0 && fn::argmax_hits(best, static_cast<int64_t>(label[r]))) atomicAdd(correct, 1ull);
  }
}

}  // namespace mix::cuda
