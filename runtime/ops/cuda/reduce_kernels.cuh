#pragma once
// The kernels of mean and mean_grad (reduce.cu's header says what they
// compute). Like row_group.cuh they need no CUDA header, so
// tests/unit/test_reduce_kernels_emulated.cc runs this same source on the CPU.
#include <algorithm>
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/column_sums.cuh"
#include "runtime/ops/cuda/row_group.cuh"
#include "runtime/ops/cuda/scalar_ref.cuh"

namespace mix::cuda {

// Blocks of mean's first pass: a function of numel only (never of the GPU), so
// the partition, hence the result, is the same on every device.
inline int mean_blocks(int64_t n) {
  constexpr int64_t kPerBlock = kBlock * 8;
  return static_cast<int>(std::clamp<int64_t>((n + kPerBlock - 1) / kPerBlock, 1, 1024));
}

/// The first pass, mean_blocks(n) blocks of kBlock threads: partial[b] = the
/// double sum of block b's grid-strided share of x.
template <typename T>
__global__ void mean_partial_sums(const T* x, int64_t n, double* partial) {
  __shared__ double shared[kBlock];
  double s = 0.0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kBlock;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kBlock) + threadIdx.x; i < n; i += stride)
    s = __dadd_rn(s, static_cast<double>(to_float(x[i])));
  s = block_reduce(s, shared, AddRnDouble{});
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/// The second pass, one block: out[0] = fn::mean_from_sum of the partials' sum.
template <typename T>
__global__ void mean_finish(const double* partial, int blocks, int64_t n, T* out) {
  __shared__ double shared[kBlock];
  double s = 0.0;
  for (int b = static_cast<int>(threadIdx.x); b < blocks; b += kBlock) s = __dadd_rn(s, partial[b]);
  s = block_reduce(s, shared, AddRnDouble{});
  if (threadIdx.x == 0) out[0] = from_float<T>(fn::mean_from_sum(s, n));
}

/// mean_grad's map: dx[i] = fn::mean_grad_value(dOut, n), dOut read from device memory.
template <typename T>
struct MeanGradFill {
  ScalarRef dout;
  int64_t n;
  T* dx;
  __device__ void operator()(int64_t i) const { dx[i] = from_float<T>(fn::mean_grad_value(load_as_float(dout), n)); }
};

}  // namespace mix::cuda
