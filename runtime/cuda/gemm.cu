// cuBLAS GEMM with row-major semantics. cuBLAS is column-major: a row-major
// [r, c] buffer is, unchanged, the column-major [c, r] matrix (its transpose).
// So the row-major C = op(A) op(B) is computed as the column-major
//     C^T[n, m] = op(B)^T[n, k] . op(A)^T[k, m],
// i.e. cuBLAS gets B first, then A, with m and n swapped and the same
// transpose flags; every leading dimension is a row length of the row-major buffer.
#include "runtime/cuda/gemm.h"

#include <cublasLt.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "runtime/core/check.h"
#include "runtime/cuda/cublas_check.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/core/half.h"
#include "runtime/core/tensor.h"
#include "runtime/cuda/device_allocator.h"  // DeviceGuard
#include "runtime/cuda/launch.cuh"

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

// ---- gemm_bias: cuBLASLt's bias epilogue ------------------------------------------------
//
// In the column-major view above, C^T[n, m] = op(B)^T . A^T: cuBLASLt's "A" is
// our B ([n, k] read as [k, n] transposed, or [k, n] as [n, k]), its "B" our A,
// and the bias, of length n, runs down D's rows, which is what
// CUBLASLT_EPILOGUE_BIAS broadcasts over D's columns.

namespace {

cublasLtHandle_t cublaslt_handle(DeviceContext& ctx) {
  std::lock_guard<std::mutex> lock(handle_mutex());
  if (!ctx.cublaslt) {
    DeviceGuard guard(ctx.device);
    MIX_CUBLAS_CHECK(cublasLtCreate(&ctx.cublaslt));
  }
  return ctx.cublaslt;
}

// The largest power of two, up to 256, that divides every address: what
// cuBLASLt may assume of the operands (its default assumes 256).
uint32_t alignment_of(std::initializer_list<const void*> ptrs) {
  uint32_t a = 256;
  for (const void* p : ptrs)
    while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

// A shape's descriptors and the algorithm cuBLASLt's heuristic chose, made
// once (the heuristic costs the host more than the launch); never destroyed,
// as the convolutions' plans are not.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  bool usable = false;
  std::string why;  // when not usable
};

// Device, m, n, k, trans_b, dtype, compute type, the operands' alignment, the bias's.
using LtKey = std::tuple<int, int64_t, int64_t, int64_t, bool, int, int, uint32_t, uint32_t>;
std::mutex g_lt_mu;
std::map<LtKey, std::shared_ptr<LtPlan>>& g_lt_plans = *new std::map<LtKey, std::shared_ptr<LtPlan>>;
std::atomic<uint64_t> g_epilogue_runs{0};

// Sets up `p` for the shape (cuBLASLt's column-major dims: cm x cn = op(B)^T[cm, ck] . A^T[ck, cn]);
// on failure p.usable stays false and p.why says where. `bias` is this call's:
// the heuristic reads the bias pointer's alignment from the descriptor (the
// plan is kept for biases of the same alignment, which its key holds).
void make_lt_plan(cublasLtHandle_t lt, LtPlan& p, bool trans_b, int cm, int cn, int ck, int ld_b, int ld_a,
                  cudaDataType type, cublasComputeType_t compute, uint32_t alignment, const void* bias,
                  size_t workspace_limit) {
  auto ok = [&p](cublasStatus_t st, const char* what) {
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    p.why = std::string(what) + ": " + cublas_status_text(st);
    return false;
  };
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  const int32_t bias_type = type;
  if (!ok(cublasLtMatmulDescCreate(&p.op, compute, CUDA_R_32F), "cublasLtMatmulDescCreate") ||
      !ok(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b), "TRANSA") ||
      !ok(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof op_a), "TRANSB") ||
      !ok(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
          "EPILOGUE") ||
      !ok(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
          "BIAS_DATA_TYPE") ||
      !ok(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), "BIAS_POINTER"))
    return;
  // Each operand as stored: rows x cols with its leading dimension.
  if (!ok(cublasLtMatrixLayoutCreate(&p.a, type, trans_b ? ck : cm, trans_b ? cm : ck, ld_b), "layout of B") ||
      !ok(cublasLtMatrixLayoutCreate(&p.b, type, ck, cn, ld_a), "layout of A") ||
      !ok(cublasLtMatrixLayoutCreate(&p.c, type, cm, cn, cm), "layout of C"))
    return;
  cublasLtMatmulPreference_t pref = nullptr;
  if (!ok(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate")) return;
  const uint64_t ws = workspace_limit;
  // As the cuBLAS handle's math mode: split-K partial sums never rounded to a
  // 16-bit C. Both INPLACE (partial sums added in D, in D's type) and
  // OUTPUT_TYPE keep them in C's type, so only an FP32 C may have INPLACE;
  // COMPUTE_TYPE keeps them in FP32. An algorithm without split-K (scheme
  // NONE) passes any mask.
  uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  if (type == CUDA_R_32F) reductions |= CUBLASLT_REDUCTION_SCHEME_INPLACE;
  bool set = ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                "MAX_WORKSPACE_BYTES") &&
             ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                                     sizeof reductions),
                "REDUCTION_SCHEME_MASK");
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    set = set && ok(cublasLtMatmulPreferenceSetAttribute(pref, attr, &alignment, sizeof alignment), "MIN_ALIGNMENT");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (set && ok(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found),
                "cublasLtMatmulAlgoGetHeuristic")) {
    if (found > 0) {
      p.algo = result.algo;
      p.workspace = result.workspaceSize;
      p.usable = true;
    } else {
      p.why = "cuBLASLt's heuristic found no algorithm";
    }
  }
  MIX_CUBLAS_CHECK_NOTHROW(cublasLtMatmulPreferenceDestroy(pref));
}

// c[i] = round(sums[i] + bias[i % n]) to T: the fallback's epilogue, the
// same rounding point as cuBLASLt's.
template <typename T>
void add_bias_as(const float* sums, const void* bias, void* c, int64_t total, int64_t n, cudaStream_t stream) {
  const T* b = static_cast<const T*>(bias);
  T* out = static_cast<T*>(c);
  launch_grid_stride(total, stream,
                     [=] __device__(int64_t i) { out[i] = from_float<T>(sums[i] + to_float(b[i % n])); });
}

void add_bias_and_round(const float* sums, const void* bias, void* c, DType dtype, int64_t rows, int64_t n,
                        cudaStream_t stream) {
  switch (dtype) {
    case DType::f32: return add_bias_as<float>(sums, bias, c, rows * n, n, stream);
    case DType::f16: return add_bias_as<half_t>(sums, bias, c, rows * n, n, stream);
    case DType::bf16: return add_bias_as<bf16_t>(sums, bias, c, rows * n, n, stream);
    default: MIX_FAIL("gemm_bias: dtype " << dtype_name(dtype) << " is not a GEMM type (expected f32, f16 or bf16)");
  }
}

}  // namespace

uint64_t gemm_bias_epilogue_runs() { return g_epilogue_runs.load(std::memory_order_relaxed); }

void gemm_bias(DeviceContext& ctx, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
               const void* b, const void* bias, void* c, DType dtype) {
  const cudaDataType type = cuda_type(dtype);
  MIX_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm_bias: negative size m=" << m << " n=" << n << " k=" << k);
  if (m == 0 || n == 0) return;
  MIX_CHECK(c && bias && (k == 0 || (a && b)), "gemm_bias: null device pointer (m=" << m << " n=" << n << " k=" << k
                                                                                 << ")");
  DeviceGuard on_device(ctx.device);
  cublas_handle(ctx);  // the workspace, which cuBLASLt's calls share
  const cudaStream_t stream = ctx.compute.get();
  const int cm = checked_int(n, "n", m, n, k, 1), cn = checked_int(m, "m", m, n, k, 1);
  const int ck = checked_int(k, "k", m, n, k, 1);
  const int ld_b = checked_int(std::max<int64_t>(1, trans_b ? k : n), "ldb", m, n, k, 1);
  const int ld_a = checked_int(std::max<int64_t>(1, k), "lda", m, n, k, 1);
  const cublasComputeType_t compute = gemm_compute_type(dtype);
  const uint32_t alignment = alignment_of({a, b, c});
  // cuBLASLt reads the bias with vector loads: an unaligned one (never from
  // the allocator, whose blocks are far more aligned) takes the fallback.
  const bool bias_aligned = reinterpret_cast<uintptr_t>(bias) % 16 == 0;
  if (k > 0 && bias_aligned) {
    const uint32_t bias_alignment = alignment_of({bias});
    const LtKey key = std::make_tuple(ctx.device, m, n, k, trans_b, static_cast<int>(dtype), static_cast<int>(compute),
                                      alignment, bias_alignment);
    // Held until the launch is queued: the plan's descriptor carries this
    // call's bias pointer from the attribute set to cublasLtMatmul.
    std::lock_guard<std::mutex> lock(g_lt_mu);
    auto it = g_lt_plans.find(key);
    if (it == g_lt_plans.end()) {
      auto fresh = std::make_shared<LtPlan>();
      make_lt_plan(cublaslt_handle(ctx), *fresh, trans_b, cm, cn, ck, ld_b, ld_a, type, compute, alignment, bias,
                   ctx.cublas_workspace_bytes);
      if (!fresh->usable)
        log_warning("gemm_bias: no cuBLASLt bias epilogue for " + std::to_string(m) + " x " + std::to_string(n) +
                    " x " + std::to_string(k) + " " + std::string(dtype_name(dtype)) + " (" + fresh->why +
                    "); adding the bias in a kernel of its own");
      it = g_lt_plans.emplace(key, fresh).first;
    }
    LtPlan& plan = *it->second;
    if (plan.usable) {
      const float beta = 0.f;
      cublasStatus_t st =
          cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmul(cublaslt_handle(ctx), plan.op, &alpha, b, plan.a, a, plan.b, &beta, c, plan.c, c, plan.c,
                            &plan.algo, ctx.cublas_workspace, plan.workspace, stream);
      if (st == CUBLAS_STATUS_SUCCESS) {
        g_epilogue_runs.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess && capture != cudaStreamCaptureStatusNone)
        MIX_CUBLAS_CHECK(st);  // an invalidated recording refuses everything: the recording gives up
      log_warning("gemm_bias: cuBLASLt refused its plan for " + std::to_string(m) + " x " + std::to_string(n) + " x " +
                  std::to_string(k) + " " + std::string(dtype_name(dtype)) + " (" + cublas_status_text(st) +
                  "); adding the bias in a kernel of its own from now on");
      plan.usable = false;
    }
  }
  // The fallback: FP32 sums in scratch (beta 0; k == 0 writes zeros), then the bias and the one rounding.
  Tensor sums = Tensor::empty({m * n}, DType::f32, Device{DeviceKind::cuda, ctx.device});
  gemm_mixed(ctx, false, trans_b, m, n, k, alpha, a, b, 0.f, sums.raw(), dtype, DType::f32);
  add_bias_and_round(sums.data<float>(), bias, c, dtype, m, n, stream);
}

}  // namespace mix::cuda
