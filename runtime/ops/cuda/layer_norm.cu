// CUDA kernels of layer_norm and layer_norm_grad over X viewed as [rows, cols]
// (layer_norm_rules::norm_dims). The element steps are those of
// runtime/kernels/layer_norm_row.h (ln_inv_std, LayerNormNormalize, ln_xhat,
// LayerNormBackward), the CPU kernel's; only the row sums differ:
//
//  - a row belongs to one warp when cols <= 1024 (the Transformer's d_model),
//    else to a block of 256 threads; its sums are per-thread strided partial
//    sums combined by RowGroup::reduce, a fixed tree (a 5-level butterfly in a
//    warp, 8 levels in a block): deterministic, with no atomics. They run in FP32
//    (__fadd_rn, never fused), where the CPU sums in double: two passes
//    (mean, then sum((x - mean)^2)), so the variance does not cancel. The
//    statistics then differ from the CPU's by a few FP32 roundings of the
//    row's magnitudes (about (cols/threads + 5 or 8)·2^-24 relative), far below
//    what an FP16 output can show, and a few ulps in FP32.
//  - Scale@GRAD and Bias@GRAD are column sums over rows. They are summed in
//    double, as on the CPU, over a fixed partition of the rows: each block
//    sums a chunk of rows for 256 columns into a workspace, a second kernel
//    adds the chunks in order. The terms (dy and dy·xhat, an exact product in
//    double) are the CPU's exactly, so the float results agree with the CPU's
//    except where the double sum lies within a double rounding of a float
//    rounding boundary (then by one ulp).
#include <cstdint>

#include "runtime/kernels/layer_norm_row.h"
#include "runtime/ops/accumulate_input.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/cuda/layer_norm_kernels.cuh"
#include "runtime/ops/layer_norm_shapes.h"

namespace mix::cuda {
namespace {

// ---- launchers -----------------------------------------------------------------------

using layer_norm_rules::NormDims;

void layer_norm_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");  // by value: Y may replace X's scope entry
  check_on_device(ctx, x, "X");
  MIX_CHECK(is_floating(x.dtype()), "layer_norm: X must be a float tensor, got " << dtype_name(x.dtype()));
  const NormDims d = layer_norm_rules::norm_dims(ctx.op, x.shape());
  const float* scale = layer_norm_rules::param(ctx, "Scale", d.cols);
  const float* bias = layer_norm_rules::param(ctx, "Bias", d.cols);
  if (scale) check_on_device(ctx, *ctx.in_opt("Scale"), "Scale");
  if (bias) check_on_device(ctx, *ctx.in_opt("Bias"), "Bias");
  const float eps = ctx.attr<float>("epsilon", 1e-5f);
  Tensor& y = ctx.out("Y", x.shape(), layer_norm_rules::y_dtype(ctx.op, x.dtype()));
  float* mean = ctx.wants("Mean") ? ctx.out("Mean", {d.rows}, DType::f32).data<float>() : nullptr;
  float* var = ctx.wants("Variance") ? ctx.out("Variance", {d.rows}, DType::f32).data<float>() : nullptr;
  if (d.rows == 0) return;
  const cudaStream_t stream = compute_stream(ctx);
  widening::dispatch(y.dtype(), x.dtype(), [&](auto y_tag, auto x_tag) {
    using T = decltype(x_tag);
    using TY = decltype(y_tag);
    with_row_group(d.cols, [&](auto threads) {
      constexpr int kThreads = decltype(threads)::value;
      layer_norm_rows<T, TY, T, kThreads><<<row_group_blocks<kThreads>(d.rows), kBlock, 0, stream>>>(
          x.data<T>(), ResidualAdd<T, T>{}, y.data<TY>(), mean, var, scale, bias, d.rows, d.cols, eps);
      MIX_CUDA_CHECK(cudaGetLastError());
    });
  });
}

void layer_norm_grad_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  const Tensor dy = ctx.in("Y@GRAD");
  layer_norm_rules::check_grad_input(x, dy);
  MIX_CHECK(is_floating(x.dtype()), "layer_norm_grad: X must be a float tensor, got " << dtype_name(x.dtype()));
  const NormDims d = layer_norm_rules::norm_dims(ctx.op, x.shape());
  const float* scale = layer_norm_rules::param(ctx, "Scale", d.cols);
  const Tensor mean = ctx.in("Mean");
  const Tensor var = ctx.in("Variance");
  layer_norm_rules::check_stats(mean, var, d.rows);
  check_on_device(ctx, x, "X");
  check_on_device(ctx, dy, "Y@GRAD");
  check_on_device(ctx, mean, "Mean");
  check_on_device(ctx, var, "Variance");
  if (scale) check_on_device(ctx, *ctx.in_opt("Scale"), "Scale");
  const float eps = ctx.attr<float>("epsilon", 1e-5f);
  const bool want_scale = ctx.wants("Scale@GRAD"), want_bias = ctx.wants("Bias@GRAD");
  MIX_CHECK(!want_scale || scale, "layer_norm_grad: Scale@GRAD is wanted but the op has no Scale");
  const Tensor* acc_in = grad_part::accumulate(ctx, "X@GRAD", x.shape(), x.dtype(), false);
  MIX_CHECK(!acc_in || ctx.wants("X@GRAD"), "layer_norm_grad: Accumulate is given but X@GRAD is not wanted");
  const Tensor acc = acc_in ? *acc_in : Tensor();  // by value: X@GRAD may replace scope entries
  if (acc_in) check_on_device(ctx, acc, "Accumulate");
  Tensor* dx = ctx.wants("X@GRAD") ? &ctx.out("X@GRAD", x.shape(), x.dtype()) : nullptr;
  float* dscale = want_scale ? ctx.out("Scale@GRAD", {d.cols}, DType::f32).data<float>() : nullptr;
  float* dbias = want_bias ? ctx.out("Bias@GRAD", {d.cols}, DType::f32).data<float>() : nullptr;
  const cudaStream_t stream = compute_stream(ctx);
  if (d.rows == 0) {  // empty sums
    if (dscale) MIX_CUDA_CHECK(cudaMemsetAsync(dscale, 0, static_cast<size_t>(d.cols) * sizeof(float), stream));
    if (dbias) MIX_CUDA_CHECK(cudaMemsetAsync(dbias, 0, static_cast<size_t>(d.cols) * sizeof(float), stream));
    return;
  }
  // The partition of the rows into chunks depends on the shape only (never on
  // the GPU), so the column sums are reproducible everywhere.
  const auto [chunks, rows_per_chunk] = row_chunks(d.rows, kLayerNormParamRowsPerChunk, kLayerNormParamMaxChunks);
  // Doubles in i64 tensors (the same 8 bytes; there is no f64 dtype), as reduce.cu does.
  Tensor partial_scale, partial_bias;
  if (want_scale) partial_scale = Tensor::empty({chunks, d.cols}, DType::i64, ctx.env.device);
  if (want_bias) partial_bias = Tensor::empty({chunks, d.cols}, DType::i64, ctx.env.device);
  auto* ps = want_scale ? static_cast<double*>(partial_scale.raw()) : nullptr;
  auto* pb = want_bias ? static_cast<double*>(partial_bias.raw()) : nullptr;
  widening::dispatch(dy.dtype(), x.dtype(), [&](auto dy_tag, auto x_tag) {
    using T = decltype(x_tag);
    using TDY = decltype(dy_tag);
    if (dx) {
      with_row_group(d.cols, [&](auto threads) {
        constexpr int kThreads = decltype(threads)::value;
        layer_norm_grad_rows<T, TDY, kThreads><<<row_group_blocks<kThreads>(d.rows), kBlock, 0, stream>>>(
            x.data<T>(), dy.data<TDY>(), dx->data<T>(), acc_in ? acc.data<T>() : nullptr, scale, mean.data<float>(),
            var.data<float>(), d.rows, d.cols, eps);
        MIX_CUDA_CHECK(cudaGetLastError());
      });
    }
    if ((!want_scale && !want_bias) || d.cols == 0) return;  // cols 0: empty dscale/dbias, and no 0-wide grid
    const dim3 grid(static_cast<unsigned>((d.cols + kBlock - 1) / kBlock), static_cast<unsigned>(chunks));
    layer_norm_param_partials<T, TDY><<<grid, kBlock, 0, stream>>>(x.data<T>(), dy.data<TDY>(), mean.data<float>(),
                                                                   var.data<float>(), d.rows, d.cols, rows_per_chunk,
                                                                   eps, ps, pb);
    MIX_CUDA_CHECK(cudaGetLastError());
    using Sum = ChunkColumnSum<double, AddRnDouble, float>;
    if (want_scale) launch_grid_stride(d.cols, stream, Sum{ps, dscale, chunks, d.cols});
    if (want_bias) launch_grid_stride(d.cols, stream, Sum{pb, dbias, chunks, d.cols});
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("layer_norm", layer_norm_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("layer_norm_grad", layer_norm_grad_cuda);

}  // namespace
}  // namespace mix::cuda
