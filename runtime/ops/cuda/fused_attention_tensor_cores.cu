// fused_attention on tensor cores: the FlashAttention-2 schedule with WMMA
// 16x16x16 products (FP16 or BF16 in, FP32 sums), for FP16 and BF16 Q, K, V
// with head_dim 32, 64, 96 or 128 on sm_80 and later. The math is
// runtime/kernels/attention_row.h's, as in the FP32 kernels of
// fused_attention.cu, which run every other problem.
//
// Rounding points: as the op's (runtime/ops/fused_attention.cc), with two
// more, where tensor cores need 16-bit operands: the forward's exp(s - max)
// weights go into P V rounded to the input dtype (the row's sum of them, its
// LSE and the final division use the FP32 values), and the backward's P and
// dS go into dV = P^T dO, dQ = dS K and dK = dS^T Q rounded to it. This is
// what FlashAttention and cuDNN's fused attention do; each rounding is a
// relative error of half an ulp of the dtype on one term of an FP32 sum, so
// the results stay within that of the terms' absolute sum
// (tests/unit/test_cuda_fused_attention.cc states and checks the bound).
//
// Layout and work: Q [groups, T, D], K and V [groups, S, D] contiguous. A
// block of 4 warps owns kRows = 64 rows (queries; keys in the dK/dV kernel),
// a warp 16 of them, and walks the other side in tiles of kCols = 64 rows
// staged through shared memory as 16-bit values. Each warp's 16 x 64 scores
// go through shared memory as FP32 (WMMA's register layout is opaque); two
// lanes then own one row of them, every other column each (fewer bank
// conflicts than halves), for the softmax steps.
//  - forward: online softmax over key tiles; the output sums (16 x D per
//    warp, FP32) live in shared memory, as each tile rescales them by row.
//  - backward, deterministic (no atomics): delta = rowsum(dO * O) comes from
//    fused_attention.cu; dK and dV a block per 64 keys over the query tiles
//    that see them, dQ a block per 64 queries over their key tiles, both
//    recomputing P = exp(s - lse); their sums stay in WMMA accumulators.
// Causal tiles stop at the last key the block's last query sees (dK/dV start
// at the first query that sees the block's first key).
//
// The kernels are in fused_attention_tensor_cores_kernels.cuh, which
// tests/unit/test_attention_tensor_cores_emulated.cc also runs on the CPU;
// this file launches them.
#include "runtime/ops/cuda/fused_attention_tensor_cores.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "runtime/cuda/context.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/ops/cuda/fused_attention_tensor_cores_kernels.cuh"

namespace mix::cuda::attention_tensor_cores {
namespace {

__device__ unsigned char* dynamic_shared() {
  extern __shared__ __align__(128) unsigned char shared[];
  return shared;
}

// ---- launchers -------------------------------------------------------------------------

// f(T{}) for FP16 and BF16.
template <typename F>
void with_16bit_type(DType dtype, F&& f) {
  if (dtype == DType::f16)
    f(half_t{});
  else
    f(bf16_t{});
}

// Launches `kernel` over (groups, row tiles) with `bytes` of dynamic shared
// memory, raising the kernel's limit above the default 48 KiB once.
// (The kernel is a template argument so that each kernel gets its own
// once; their pointer types are shared.)
template <auto kKernel, typename... Args>
void launch(const AttentionDims& a, int64_t rows, size_t bytes, cudaStream_t stream, Args... args) {
  static const bool raised = [bytes] {
    MIX_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    return true;
  }();
  (void)raised;
  const dim3 grid(static_cast<unsigned>(a.groups), static_cast<unsigned>((rows + kRows - 1) / kRows));
  kKernel<<<grid, kThreads, bytes, stream>>>(args...);
  MIX_CUDA_CHECK(cudaGetLastError());
}

bool compute_capability_8_or_more() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  return major >= 8;
}

const uint16_t* bits(const void* p) { return static_cast<const uint16_t*>(p); }

}  // namespace

bool applies(const AttentionDims& a, DType dtype, std::initializer_list<const void*> tensors) {
  if (!tensor_core_attention()) return false;
  if (dtype != DType::f16 && dtype != DType::bf16) return false;
  if (!with_head_dim(a.d, [](auto) {})) return false;
  for (const void* p : tensors)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  static const bool capable = compute_capability_8_or_more();
  return capable;
}

void forward(const AttentionDims& a, DType dtype, const void* q, const void* k, const void* v, void* out, float* lse,
             cudaStream_t stream) {
  with_16bit_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    with_head_dim(a.d, [&](auto dim) {
      constexpr int kD = decltype(dim)::value;
      launch<forward_kernel<T, kD>>(a, a.t_q, ForwardShared<kD>::bytes(), stream, bits(q), bits(k), bits(v),
                                    static_cast<T*>(out), lse, a);
    });
  });
}

void grad(const AttentionDims& a, DType dtype, const void* q, const void* k, const void* v, const void* dout,
          const float* lse, const float* delta, void* dq, void* dk, void* dv, cudaStream_t stream) {
  with_16bit_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    with_head_dim(a.d, [&](auto dim) {
      constexpr int kD = decltype(dim)::value;
      if (dk != nullptr && a.t_k > 0)
        launch<grad_kv_kernel<T, kD>>(a, a.t_k, GradKvShared<kD>::bytes(), stream, bits(q), bits(k), bits(v),
                                      bits(dout), lse, delta, static_cast<T*>(dk), static_cast<T*>(dv), a);
      if (dq != nullptr && a.t_q > 0)
        launch<grad_q_kernel<T, kD>>(a, a.t_q, GradQShared<kD>::bytes(), stream, bits(q), bits(k), bits(v), bits(dout),
                                     lse, delta, static_cast<T*>(dq), a);
    });
  });
}

}  // namespace mix::cuda::attention_tensor_cores
