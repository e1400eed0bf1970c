#pragma once
// The kernels of layer norm: the forward row kernel, shared by layer_norm
// (layer_norm.cu) and fused_add_layer_norm (fused_add_layer_norm.cu), which
// first adds a residual operand to X and normalises the stored sums; X@GRAD's
// row kernel; and the first pass of Scale@GRAD's and Bias@GRAD's column sums
// (layer_norm.cu). Sums and element steps as layer_norm.cu's header
// describes them. Like row_group.cuh it needs no CUDA header, so
// tests/unit/test_layer_norm_kernels_emulated.cc runs this same source on the CPU.
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/kernels/functors.h"
#include "runtime/kernels/layer_norm_row.h"
#include "runtime/ops/cuda/row_group.cuh"

namespace mix::cuda {

/// fused_add_layer_norm's add before the norm: Out = X + Y, rounded to X's
/// type T as elementwise_add stores it, Y (of type TA) repeating every
/// `period` values (X's shape, or its trailing dims). `y` null: no add (plain
/// layer_norm).
template <typename T, typename TA>
struct ResidualAdd {
  const TA* y = nullptr;
  int64_t period = 0;
  T* out = nullptr;
};

/// Norm, Mean and Variance (the latter two may be null) of each row of x, or
/// with add.y of each row of x + add.y, written to add.out first: each thread
/// stores its sums and reads back only those it stored, so the row is read
/// once from memory, and the statistics and Norm come from the stored (rounded)
/// values, as layer_norm computes them from elementwise_add's output. Norm may
/// be narrower than X (attr out_dtype), rounded once on store.
template <typename T, typename TY, typename TA, int kThreads>
__global__ void layer_norm_rows(const T* x, ResidualAdd<T, TA> add, TY* y, float* mean_out, float* var_out,
                                const float* scale, const float* bias, int64_t rows, int64_t cols, float eps) {
  using G = RowGroup<kThreads>;
  __shared__ float shared[kBlock / kWarp];
  const float n = static_cast<float>(cols);
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const T* xr = x + r * cols;
    const T* src = add.y ? add.out + r * cols : xr;  // the row normalised
    TY* yr = y + r * cols;
    float s = 0.f;
    for (int64_t j = G::tid(); j < cols; j += kThreads) {
      if (add.y) {
        const int64_t at = r * cols + j;
        const int64_t i = add.period == rows * cols ? at : at % add.period;
        add.out[at] = from_float<T>(fn::Add{}(to_float(xr[j]), to_float(add.y[i])));  // elementwise_add's functor
      }
      s = __fadd_rn(s, to_float(src[j]));
    }
    const float mean = __fdiv_rn(G::reduce(s, shared, AddRn{}), n);
    float ss = 0.f;
    for (int64_t j = G::tid(); j < cols; j += kThreads) {
      const float d = __fsub_rn(to_float(src[j]), mean);
      ss = __fadd_rn(ss, __fmul_rn(d, d));
    }
    const float var = __fdiv_rn(G::reduce(ss, shared, AddRn{}), n);
    const fn::LayerNormNormalize f{mean, fn::ln_inv_std(var, eps)};
    for (int64_t j = G::tid(); j < cols; j += kThreads)
      yr[j] = from_float<TY>(f(to_float(src[j]), scale ? scale[j] : 1.f, bias ? bias[j] : 0.f));
    if (G::tid() == 0) {
      if (mean_out) mean_out[r] = mean;
      if (var_out) var_out[r] = var;
    }
  }
}

// X@GRAD of each row from the saved statistics (fn::LayerNormBackward). dy
// may be narrower than x and dx (a narrower Y's gradient), widened on load.
// With acc (input Accumulate, else null), X's gradient's other part is added
// (fn::add_grad_part).
template <typename T, typename TDY, int kThreads>
__global__ void layer_norm_grad_rows(const T* x, const TDY* dy, T* dx, const T* acc, const float* scale,
                                     const float* mean_in, const float* var_in, int64_t rows, int64_t cols, float eps) {
  using G = RowGroup<kThreads>;
  __shared__ float shared[kBlock / kWarp];
  const float n = static_cast<float>(cols);
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const T* xr = x + r * cols;
    const TDY* dyr = dy + r * cols;
    const float mean = mean_in[r], inv_std = fn::ln_inv_std(var_in[r], eps);
    float sg = 0.f, sgx = 0.f;
    for (int64_t j = G::tid(); j < cols; j += kThreads) {
      const float g = __fmul_rn(to_float(dyr[j]), scale ? scale[j] : 1.f);
      sg = __fadd_rn(sg, g);
      sgx = __fadd_rn(sgx, __fmul_rn(g, fn::ln_xhat(to_float(xr[j]), mean, inv_std)));
    }
    sg = G::reduce(sg, shared, AddRn{});
    sgx = G::reduce(sgx, shared, AddRn{});
    const fn::LayerNormBackward b{mean, inv_std, __fdiv_rn(sg, n), __fdiv_rn(sgx, n)};
    T* dxr = dx + r * cols;
    const T* accr = acc ? acc + r * cols : nullptr;
    for (int64_t j = G::tid(); j < cols; j += kThreads) {
      const float own = b(to_float(xr[j]), to_float(dyr[j]), scale ? scale[j] : 1.f);
      dxr[j] = accr ? fn::add_grad_part<T>(own, to_float(accr[j])) : from_float<T>(own);
    }
  }
}

// ---- Scale@GRAD and Bias@GRAD: column sums in double over chunks of rows -------------------

/// Rows per chunk of the parameter gradients' column sums (before the cap on chunks).
inline constexpr int64_t kLayerNormParamRowsPerChunk = 32;
inline constexpr int64_t kLayerNormParamMaxChunks = 1024;

/// Column partial sums over one chunk of rows (blockIdx.y), in double: Bias@GRAD's
/// dy and Scale@GRAD's dy·xhat (either output may be skipped: null). A thread a
/// column (blockIdx.x tiles them by kBlock); partial_* are [chunks, cols], added
/// in chunk order by ChunkColumnSum (column_sums.cuh).
template <typename T, typename TDY>
__global__ void layer_norm_param_partials(const T* x, const TDY* dy, const float* mean_in, const float* var_in,
                                          int64_t rows, int64_t cols, int64_t rows_per_chunk, float eps,
                                          double* partial_scale, double* partial_bias) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (c >= cols) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  double ds = 0.0, db = 0.0;
  for (int64_t r = begin; r < end; ++r) {
    const float g = to_float(dy[r * cols + c]);
    if (partial_bias) db = __dadd_rn(db, static_cast<double>(g));
    if (partial_scale) {
      const float xhat = fn::ln_xhat(to_float(x[r * cols + c]), mean_in[r], fn::ln_inv_std(var_in[r], eps));
      ds = __dadd_rn(ds, __dmul_rn(static_cast<double>(g), static_cast<double>(xhat)));
    }
  }
  const int64_t at = static_cast<int64_t>(blockIdx.y) * cols + c;
  if (partial_scale) partial_scale[at] = ds;
  if (partial_bias) partial_bias[at] = db;
}

}  // namespace mix::cuda
