#pragma once
// GEMM for the CPU ops. Inputs of any floating dtype are widened to FP32,
// multiplied by OpenBLAS SGEMM with FP32 accumulation, and the result is
// rounded to the output dtype on store: the numerics of an FP16 tensor-core
// GEMM with FP32 accumulation.
#include <cstdint>

#include "runtime/core/float_convert.h"
#include "runtime/core/tensor.h"

namespace mix::cpu {

/// C[m,n] = alpha * op(A) op(B) + beta * C, row-major, all FP32.
/// op(A) is A[m,k] or, with trans_a, A[k,m] transposed.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
           float beta, float* c);

/// Runs sgemm on tensors of any floating dtype and stores into `out` (its dtype decides rounding).
void gemm_tensors(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& b,
                  Tensor& out);

}  // namespace mix::cpu
