#pragma once
// GEMM for the CPU ops. Inputs of any floating dtype are widened to FP32,
// multiplied by OpenBLAS SGEMM with FP32 accumulation, and the result is
// rounded to the output dtype on store: the numerics of an FP16 tensor-core
// GEMM with FP32 accumulation.
#include <cstdint>

#include "runtime/tensor.h"

namespace mix::cpu {

/// A read-only FP32 view of a tensor: the data itself for f32, else a widened
/// copy held in a per-thread scratch slot (0..3) reused across calls.
const float* as_f32(const Tensor& t, int scratch_slot);

/// C[m,n] = alpha * op(A) op(B) + beta * C, row-major, all FP32.
/// op(A) is A[m,k] or, with trans_a, A[k,m] transposed.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
           float beta, float* c);

/// Runs sgemm on tensors of any floating dtype and stores into `out` (its dtype decides rounding).
void gemm_tensors(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& b,
                  Tensor& out);

/// Stores an FP32 buffer into a tensor of any floating dtype (rounding on store).
void store_f32(const float* src, Tensor& dst);

}  // namespace mix::cpu
