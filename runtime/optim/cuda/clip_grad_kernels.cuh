#pragma once
// The kernels and multi-tensor bodies of grad_global_norm, clip_by_global_norm
// and clip_by_value (clip_grad.cu's header says how the norm is summed). Like
// runtime/cuda/multi_tensor_kernels.cuh they need no CUDA header, so
// tests/unit/test_multi_tensor_kernels_emulated.cc runs this same source on the CPU.
// Everything here is in an unnamed namespace: clip_grad.cu alone includes it.
#include <cmath>
#include <cstdint>

#include "runtime/cuda/multi_tensor_kernels.cuh"
#include "runtime/kernels/functors.h"

namespace mix::cuda {
namespace {

// Elements a partial sum covers: divides both multi_tensor::kChunk and kAloneChunk,
// so a block's range is whole runs (the last one of a tensor cut short).
constexpr int64_t kRun = 1024;
static_assert(multi_tensor::kChunk % kRun == 0 && multi_tensor::kAloneChunk % kRun == 0);

// Block-wide sum of one value per thread (kMultiTensorThreads of them), in a fixed tree.
__device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = kMultiTensorThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();  // the next call may overwrite shared[]
  return total;
}

// Slot pointers: the gradient, and its tensor's first partial-sum slot.
struct SquareSums {
  __device__ void operator()(const TensorSlot<2>& s, int64_t begin, int64_t end) const {
    __shared__ double shared[kMultiTensorThreads];
    const float* x = static_cast<const float*>(s.ptr[0]);
    double* partial = static_cast<double*>(s.ptr[1]);
    for (int64_t run = begin; run < end; run += kRun) {
      const int64_t run_end = min(run + kRun, end);
      double v = 0;
      for (int64_t i = run + threadIdx.x; i < run_end; i += blockDim.x) v += static_cast<double>(x[i]) * x[i];
      const double total = block_sum(v, shared);
      if (threadIdx.x == 0) partial[run / kRun] = total;
    }
  }
};

// One block: norm = sqrt(sum of the partial sums), in a fixed order.
__global__ void __launch_bounds__(kMultiTensorThreads) finish_norm(const double* partial, int64_t n, float* norm) {
  __shared__ double shared[kMultiTensorThreads];
  double v = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v += partial[i];
  const double total = block_sum(v, shared);
  if (threadIdx.x == 0) *norm = static_cast<float>(sqrt(total));
}

// found_out = (found_in or 0) | !isfinite(norm): the flag of the AMP step, or the clip's own in FP32.
__global__ void raise_if_not_finite(const float* norm, const int32_t* found_in, int32_t* found_out) {
  *found_out = (found_in ? *found_in : 0) | (fn::is_finite(*norm) ? 0 : 1);
}

// Slot pointer: the gradient, scaled in place by the clip coefficient (nothing on a non-finite norm).
struct ScaleByCoefficient {
  const float* norm;
  float max_norm;
  __device__ void operator()(const TensorSlot<1>& s, int64_t begin, int64_t end) const {
    const float n = *norm;
    if (!fn::is_finite(n)) return;
    const float coef = fn::clip_coefficient(n, max_norm);
    float* g = static_cast<float*>(s.ptr[0]);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) g[i] = g[i] * coef;
  }
};

struct ClampChunk {
  fn::ClipByValue f;
  __device__ void operator()(const TensorSlot<1>& s, int64_t begin, int64_t end) const {
    float* g = static_cast<float*>(s.ptr[0]);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) g[i] = f(g[i]);
  }
};

}  // namespace
}  // namespace mix::cuda
