#pragma once
// One-element tensors that kernels read from device memory: a flag, the
// learning rate, Loss@GRAD. Like row_group.cuh it needs no CUDA header, so the
// *_emulated tests run the kernels that read them on the CPU;
// runtime/ops/cuda/device_ops.cuh includes it and adds scalar_ref(Tensor*).
#include <cstdint>

#include "runtime/core/dtype.h"
#include "runtime/core/half.h"

namespace mix::cuda {

/// A one-element tensor read by a kernel (a flag, the learning rate, Loss@GRAD):
/// its address and dtype. p == nullptr stands for an absent optional input.
struct ScalarRef {
  const void* p = nullptr;
  DType dtype = DType::f32;
};

/// Element i widened to float, as Tensor::item_float does on the host.
__device__ __forceinline__ float load_as_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::f16:
      return to_float(static_cast<const half_t*>(p)[i]);
    case DType::bf16:
      return to_float(static_cast<const bf16_t*>(p)[i]);
    case DType::i32:
      return static_cast<float>(static_cast<const int32_t*>(p)[i]);
    case DType::i64:
      return static_cast<float>(static_cast<const int64_t*>(p)[i]);
    case DType::u8:
      return static_cast<float>(static_cast<const uint8_t*>(p)[i]);
  }
  return 0.f;
}
__device__ __forceinline__ float load_as_float(ScalarRef s, int64_t i = 0) { return load_as_float(s.p, s.dtype, i); }

/// A flag such as SkipUpdate or FoundInfinite: set when present and nonzero
/// (a NaN counts as set), as the CPU kernels' item_float(0) != 0.
__device__ __forceinline__ bool flag_set(ScalarRef s) { return s.p != nullptr && load_as_float(s) != 0.f; }

}  // namespace mix::cuda
