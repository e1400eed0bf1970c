#pragma once
// The gradient all-reduce's bucket copies (allreduce_op.cu's header says where
// they run): the multi-tensor bodies that pack a bucket's tensors into its
// buffer and unpack them back, times a factor, and the choice between a plain
// copy of the bits and a scaled one. Like runtime/cuda/multi_tensor_kernels.cuh
// it needs no CUDA header, so tests/unit/test_multi_tensor_kernels_emulated.cc
// runs this same source on the CPU.
#include <cstdint>

#include "runtime/core/check.h"
#include "runtime/core/dtype.h"
#include "runtime/core/half.h"
#include "runtime/cuda/copy_unit.cuh"
#include "runtime/cuda/multi_tensor_kernels.cuh"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"

namespace mix::collective {

/// A block's chunk of dst = src (slot pointers: src, dst), in units of U, an
/// unsigned type of the element's size: a copy of any dtype, bits unchanged.
template <typename U>
struct BucketCopyChunk {
  __device__ void operator()(const cuda::TensorSlot<2>& s, int64_t begin, int64_t end) const {
    const U* src = static_cast<const U*>(s.ptr[0]);
    U* dst = static_cast<U*>(s.ptr[1]);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) dst[i] = src[i];
  }
};

/// A block's chunk of dst = src * factor (fn::Scale), rounded to T on store as
/// the CPU's copy_scaled does.
template <typename T>
struct BucketScaledCopyChunk {
  fn::Scale op;
  __device__ void operator()(const cuda::TensorSlot<2>& s, int64_t begin, int64_t end) const {
    const T* src = static_cast<const T*>(s.ptr[0]);
    T* dst = static_cast<T*>(s.ptr[1]);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) dst[i] = from_float<T>(op(to_float(src[i])));
  }
};

/// launch(body) with the body that copies a bucket's tensors of `dtype` times
/// `factor`: a plain copy of any dtype's bits when it is 1 (integer buckets
/// of c_allreduce_sum / _max too), a floating dtype's scaling otherwise.
template <typename Launch>
void with_bucket_copy(DType dtype, float factor, Launch&& launch) {
  if (factor == 1.f) {
    const bool ran = cuda::with_copy_unit(dtype_size(dtype),
                                          [&](auto unit) { launch(BucketCopyChunk<typename decltype(unit)::type>{}); });
    MIX_CHECK(ran, "cannot copy " << dtype_name(dtype) << " elements of " << dtype_size(dtype) << " bytes");
    return;
  }
  MIX_CHECK(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16,
            "cannot scale a " << dtype_name(dtype) << " bucket (only floating buckets take pre/post scaling)");
  cpu::dispatch_floating(dtype, [&](auto tag) {
    using T = decltype(tag);
    launch(BucketScaledCopyChunk<T>{fn::Scale{factor, 0.f, true}});
  });
}

}  // namespace mix::collective
