// cuBLAS GEMM with row-major semantics. cuBLAS is column-major: a row-major
// [r, c] buffer is, unchanged, the column-major [c, r] matrix (its transpose).
// So the row-major C = op(A) op(B) is computed as the column-major
//     C^T[n, m] = op(B)^T[n, k] . op(A)^T[k, m],
// i.e. cuBLAS gets B first, then A, with m and n swapped and the same
// transpose flags; every leading dimension is a row length of the row-major buffer.
#include "runtime/cuda/gemm.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <mutex>

#include "runtime/core/check.h"
#include "runtime/cuda/cublas_check.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/device_allocator.h"  // DeviceGuard

namespace mix::cuda {

namespace {

std::mutex& handle_mutex() {
  static std::mutex m;
  return m;
}

cudaDataType cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: break;
  }
  MIX_FAIL("gemm: dtype " << dtype_name(t) << " is not a GEMM type (expected f32, f16 or bf16)");
}

int checked_int(int64_t v, const char* what, int64_t m, int64_t n, int64_t k, int64_t count) {
  MIX_CHECK(v >= 0 && v <= INT_MAX, "gemm: " << what << " = " << v << " does not fit cuBLAS's int (m=" << m << " n=" << n
                                               << " k=" << k << " batch=" << count
                                               << "); split the product into smaller GEMMs");
  return static_cast<int>(v);
}

// C = 0 for every batch entry (an empty sum; k == 0 with beta == 0).
void zero_outputs(void* c, DType c_dtype, int64_t m, int64_t n, const GemmBatch& batch, cudaStream_t stream) {
  const size_t elem = dtype_size(c_dtype);
  const size_t matrix = static_cast<size_t>(m * n) * elem;
  if (batch.count == 1 || batch.stride_c == m * n) {
    MIX_CUDA_CHECK(cudaMemsetAsync(c, 0, matrix * static_cast<size_t>(batch.count), stream));
    return;
  }
  for (int64_t i = 0; i < batch.count; ++i)
    MIX_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(c) + static_cast<size_t>(i * batch.stride_c) * elem, 0, matrix,
                                   stream));
}

}  // namespace

cublasHandle_t cublas_handle(DeviceContext& ctx) {
  std::lock_guard<std::mutex> lock(handle_mutex());
  if (ctx.cublas) return ctx.cublas;
  // The handle (and the workspace) belong to the device current at creation.
  DeviceGuard guard(ctx.device);
  cublasHandle_t h = nullptr;
  MIX_CUBLAS_CHECK(cublasCreate(&h));
  try {
    // cublasSetStream resets the workspace to cuBLAS's own pool: the stream first, then the workspace.
    MIX_CUBLAS_CHECK(cublasSetStream(h, ctx.compute.get()));
    if (!ctx.cublas_workspace) {
      MIX_CUDA_CHECK(cudaMalloc(&ctx.cublas_workspace, kCublasWorkspaceBytes));
      ctx.cublas_workspace_bytes = kCublasWorkspaceBytes;
    }
    MIX_CUBLAS_CHECK(cublasSetWorkspace(h, ctx.cublas_workspace, ctx.cublas_workspace_bytes));
    MIX_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));  // alpha and beta are host floats
    // DEFAULT: tensor cores for 16-bit inputs, and no TF32 for FP32 unless the
    // compute type asks for it (gemm_compute_type). DISALLOW_REDUCED_PRECISION_REDUCTION:
    // split-K partial sums stay in FP32 instead of being rounded to an f16/bf16 C.
    MIX_CUBLAS_CHECK(cublasSetMathMode(
        h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  } catch (...) {
    MIX_CUBLAS_CHECK_NOTHROW(cublasDestroy(h));
    throw;
  }
  ctx.cublas = h;
  return h;
}

cublasComputeType_t gemm_compute_type(DType dtype) {
  // FP32 accumulation for every input type; TF32 rounds FP32 inputs to a 10-bit mantissa, so only on request.
  if (dtype == DType::f32 && allow_tf32()) return CUBLAS_COMPUTE_32F_FAST_TF32;
  return CUBLAS_COMPUTE_32F;
}

void gemm_mixed(DeviceContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const void* a, const void* b, float beta, void* c, DType ab_dtype, DType c_dtype,
                const GemmBatch& batch) {
  const cudaDataType ab_type = cuda_type(ab_dtype), c_type = cuda_type(c_dtype);
  MIX_CHECK(c_dtype == ab_dtype || c_dtype == DType::f32,
            "gemm: " << dtype_name(ab_dtype) << " inputs with a " << dtype_name(c_dtype)
                     << " output (supported: the inputs' dtype, or f32)");
  const int64_t count = batch.count;
  MIX_CHECK(m >= 0 && n >= 0 && k >= 0 && count >= 0,
            "gemm: negative size m=" << m << " n=" << n << " k=" << k << " batch=" << count);
  if (m == 0 || n == 0 || count == 0) return;
  MIX_CHECK(count == 1 || batch.stride_c >= m * n,
            "gemm: batch entries would overlap in C (stride_c = " << batch.stride_c << " < m*n = " << m * n << ")");
  MIX_CHECK(c && (k == 0 || (a && b)), "gemm: null device pointer (m=" << m << " n=" << n << " k=" << k << ")");

  // A cuBLAS handle works only with its own GPU current. Today's callers have
  // made it so (use_device); the guard keeps a future one from a wrong-device error.
  DeviceGuard on_device(ctx.device);
  cublasHandle_t h = cublas_handle(ctx);
  if (k == 0 && beta == 0.f) {  // an empty sum; cuBLAS may not touch C when k == 0
    zero_outputs(c, c_dtype, m, n, batch, ctx.compute.get());
    return;
  }
  // Column-major view: C^T[n, m] = op(B)^T . op(A)^T (see the top of the file).
  const int cm = checked_int(n, "n", m, n, k, count);
  const int cn = checked_int(m, "m", m, n, k, count);
  const int ck = checked_int(k, "k", m, n, k, count);
  // Leading dimensions (row lengths of the row-major buffers); BLAS wants them >= 1 even when k == 0.
  const int ld_b = checked_int(std::max<int64_t>(1, trans_b ? k : n), "ldb", m, n, k, count);
  const int ld_a = checked_int(std::max<int64_t>(1, trans_a ? m : k), "lda", m, n, k, count);
  const int ld_c = cm;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasComputeType_t compute = gemm_compute_type(ab_dtype);

  if (count == 1) {
    MIX_CUBLAS_CHECK(cublasGemmEx(h, op_b, op_a, cm, cn, ck, &alpha, b, ab_type, ld_b, a, ab_type, ld_a, &beta, c,
                                  c_type, ld_c, compute, CUBLAS_GEMM_DEFAULT));
    return;
  }
  const int batch_count = checked_int(count, "batch count", m, n, k, count);
  MIX_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, op_b, op_a, cm, cn, ck, &alpha, b, ab_type, ld_b, batch.stride_b, a,
                                              ab_type, ld_a, batch.stride_a, &beta, c, c_type, ld_c, batch.stride_c,
                                              batch_count, compute, CUBLAS_GEMM_DEFAULT));
}

void gemm(DeviceContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
          const void* b, float beta, void* c, DType dtype, const GemmBatch& batch) {
  gemm_mixed(ctx, trans_a, trans_b, m, n, k, alpha, a, b, beta, c, dtype, dtype, batch);
}

}  // namespace mix::cuda
