#pragma once
// fused_attention's tensor-core kernels (fused_attention_tensor_cores.cu),
// called by the op's CUDA functions (fused_attention.cu) for the problems they
// take: FP16 or BF16 Q, K, V, head_dim 32, 64, 96 or 128, a GPU of compute
// capability 8.0 or more, 16-byte aligned tensors, and
// cuda::tensor_core_attention() on (runtime/cuda/context.h).
// Everything else runs on the FP32 kernels of fused_attention.cu.
#include <cuda_runtime.h>

#include "runtime/core/tensor.h"
#include "runtime/ops/fused_attention_shapes.h"

namespace mix::cuda::attention_tensor_cores {

/// Whether these kernels take the problem (see above); the pointers are the
/// tensors' data, checked for alignment.
bool applies(const attention_rules::AttentionDims& a, DType dtype, std::initializer_list<const void*> tensors);

/// Out [groups, t_q, d] and LSE [groups, t_q] (FP32).
void forward(const attention_rules::AttentionDims& a, DType dtype, const void* q, const void* k, const void* v,
             void* out, float* lse, cudaStream_t stream);

/// dQ (when not null) and dK, dV (when not null; both or neither) from Q, K,
/// V, dOut, LSE and delta = rowsum(dOut * Out) [groups, t_q] (FP32).
void grad(const attention_rules::AttentionDims& a, DType dtype, const void* q, const void* k, const void* v,
          const void* dout, const float* lse, const float* delta, void* dq, void* dk, void* dv, cudaStream_t stream);

}  // namespace mix::cuda::attention_tensor_cores
