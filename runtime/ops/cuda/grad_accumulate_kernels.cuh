#pragma once
// grad_accumulate's multi-tensor body (grad_accumulate.cu launches it). Like
// runtime/cuda/multi_tensor_kernels.cuh it needs no CUDA header, so
// tests/unit/test_multi_tensor_kernels_emulated.cc runs this same source on the CPU.
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/cuda/multi_tensor_kernels.cuh"
#include "runtime/kernels/functors.h"

namespace mix::cuda {

// A block's chunk of one tensor (slot pointers: X, Accum). kFinish: X = Accum + X, Accum = 0; else Accum += X.
template <typename T, bool kFinish>
struct AccumulateChunk {
  __device__ void operator()(const TensorSlot<2>& s, int64_t begin, int64_t end) const {
    T* x = static_cast<T*>(s.ptr[0]);
    float* acc = static_cast<float*>(s.ptr[1]);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const float sum = fn::Add{}(acc[i], to_float(x[i]));
      if constexpr (kFinish) {
        x[i] = from_float<T>(sum);
        acc[i] = 0.f;
      } else {
        acc[i] = sum;
      }
    }
  }
};

}  // namespace mix::cuda
