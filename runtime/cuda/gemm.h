#pragma once
// GEMM on CUDA: cuBLAS with row-major semantics (the same argument order as
// cpu::sgemm in runtime/ops/gemm.h), on the device's compute stream.
//
// Numerics, chosen to match the CPU kernels (FP32 accumulation, one rounding on store):
//   f16 / bf16: tensor cores, CUBLAS_COMPUTE_32F (FP32 accumulation), and the
//               handle disallows reduced-precision split-K reductions, so the
//               only rounding to 16 bits is the final store.
//   f32:        CUBLAS_COMPUTE_32F (true FP32, no TF32) by default;
//               CUBLAS_COMPUTE_32F_FAST_TF32 while mix::cuda::allow_tf32() is set
//               (--allow-tf32). The flag is read on every call.
#include <cublas_v2.h>

#include <cstdint>

#include "runtime/core/dtype.h"
#include "runtime/cuda/context.h"

namespace mix::cuda {

/// A strided batch: GEMM i reads A + i*stride_a, B + i*stride_b and writes
/// C + i*stride_c (strides in elements). A stride of 0 shares that operand
/// across the batch (allowed for A and B, not for C).
struct GemmBatch {
  int64_t count = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

/// Bytes of the cuBLAS workspace given to each handle (NVIDIA's recommendation for Hopper).
inline constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

/// The cuBLAS handle of `ctx`, created on first use: bound to ctx.compute, given
/// a workspace of kCublasWorkspaceBytes (stored in ctx), host pointer mode, and a
/// math mode that keeps every reduction in the FP32 accumulator. TF32 is never
/// enabled through the math mode: gemm() picks it per call with the compute type.
cublasHandle_t cublas_handle(DeviceContext& ctx);

/// The cuBLAS compute type gemm() uses for inputs of `dtype` at this moment.
cublasComputeType_t gemm_compute_type(DType dtype);

/// Row-major C[m,n] = alpha * op(A) op(B) + beta * C, for each entry of `batch`,
/// enqueued on ctx.compute. op(A) is A[m,k], or with trans_a A[k,m] transposed;
/// op(B) is B[k,n], or with trans_b B[n,k] transposed. A, B and C are dense
/// (leading dimension = row length) device buffers of `dtype` (f32, f16 or bf16).
/// Throws mix::Error when a dimension, leading dimension or the batch count does
/// not fit cuBLAS's int. k == 0 with beta == 0 writes zeros.
void gemm(DeviceContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
          const void* b, float beta, void* c, DType dtype, const GemmBatch& batch = {});

/// As gemm(), with A and B in `ab_dtype` and C in `c_dtype`. The pairs cuBLAS
/// supports: c_dtype == ab_dtype, or f16 / bf16 inputs with an f32 C (sums over
/// several GEMMs kept in FP32, rounded once by the caller).
void gemm_mixed(DeviceContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const void* a, const void* b, float beta, void* c, DType ab_dtype, DType c_dtype,
                const GemmBatch& batch = {});

/// Row-major C[m, n] = alpha * A[m, k] . op(B) + bias[n], op(B) = B[k, n] or,
/// with trans_b, B[n, k] transposed; A, B, bias and C of `dtype`, device
/// buffers, enqueued on ctx.compute. The bias is added to the FP32 sums before
/// C's one rounding: cuBLASLt's bias epilogue (CUBLASLT_EPILOGUE_BIAS), as
/// PyTorch's addmm adds a linear layer's bias. Where cuBLASLt offers no
/// algorithm for the shape, or refuses to run one, the same numbers come from
/// a GEMM into FP32 scratch and a kernel that adds the bias and rounds (warned
/// once per shape). Throws as gemm() does.
void gemm_bias(DeviceContext& ctx, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
               const void* b, const void* bias, void* c, DType dtype);

/// gemm_bias calls that ran on cuBLASLt's epilogue in this process (tests
/// tell by it which path ran).
uint64_t gemm_bias_epilogue_runs();

}  // namespace mix::cuda
