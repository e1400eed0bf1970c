#pragma once
// fused_cast's multi-tensor body (fused_cast.cu launches it). Like
// runtime/cuda/multi_tensor_kernels.cuh it needs no CUDA header, so
// tests/unit/test_multi_tensor_kernels_emulated.cc runs this same source on the CPU.
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/cuda/multi_tensor_kernels.cuh"

namespace mix::cuda {

/// A block's chunk of one tensor (slot pointers: X, Out): each element widened
/// with to_float (exact) and rounded once with from_float<To>.
template <typename From, typename To>
struct FusedCastChunk {
  __device__ void operator()(const TensorSlot<2>& s, int64_t begin, int64_t end) const {
    const From* x = static_cast<const From*>(s.ptr[0]);
    To* out = static_cast<To*>(s.ptr[1]);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) out[i] = from_float<To>(to_float(x[i]));
  }
};

}  // namespace mix::cuda
