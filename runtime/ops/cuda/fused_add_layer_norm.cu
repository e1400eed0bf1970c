// CUDA kernel of fused_add_layer_norm (runtime/ops/fused_add_layer_norm.cc):
// layer_norm's forward kernel (layer_norm_kernels.cuh) with the residual add
// before it. Its Out is elementwise_add's CUDA output bit for bit (one FP32
// add, rounded to X's dtype) and its Norm, Mean and Variance are layer_norm's
// CUDA outputs on that sum bit for bit: the same element steps and the same
// reduction trees over the same stored values.
#include <cstdint>

#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/cuda/layer_norm_kernels.cuh"
#include "runtime/ops/fused_add_layer_norm_shapes.h"
#include "runtime/ops/layer_norm_shapes.h"

namespace mix::cuda {
namespace {

void fused_add_layer_norm_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");  // by value: outputs may replace scope entries
  const Tensor y = ctx.in("Y");
  check_on_device(ctx, x, "X");
  check_on_device(ctx, y, "Y");
  add_layer_norm_rules::check_operands(ctx.op.type, x.shape(), x.dtype(), y.shape(), y.dtype());
  const layer_norm_rules::NormDims d = layer_norm_rules::norm_dims(ctx.op, x.shape());
  const float* scale = layer_norm_rules::param(ctx, "Scale", d.cols);
  const float* bias = layer_norm_rules::param(ctx, "Bias", d.cols);
  if (scale) check_on_device(ctx, *ctx.in_opt("Scale"), "Scale");
  if (bias) check_on_device(ctx, *ctx.in_opt("Bias"), "Bias");
  const float eps = ctx.attr<float>("epsilon", 1e-5f);
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  Tensor& norm = ctx.out("Norm", x.shape(), layer_norm_rules::y_dtype(ctx.op, x.dtype()));
  float* mean = ctx.out("Mean", {d.rows}, DType::f32).data<float>();
  float* var = ctx.out("Variance", {d.rows}, DType::f32).data<float>();
  if (d.rows == 0 || y.numel() == 0) return;
  const cudaStream_t stream = compute_stream(ctx);
  widening::dispatch(y.dtype(), x.dtype(), [&](auto y_tag, auto x_tag) {
    using T = decltype(x_tag);
    using TA = decltype(y_tag);
    widening::dispatch(norm.dtype(), x.dtype(), [&](auto norm_tag, auto) {
      using TY = decltype(norm_tag);
      const ResidualAdd<T, TA> add{y.data<TA>(), y.numel(), out.data<T>()};
      with_row_group(d.cols, [&](auto threads) {
        constexpr int kThreads = decltype(threads)::value;
        layer_norm_rows<T, TY, TA, kThreads><<<row_group_blocks<kThreads>(d.rows), kBlock, 0, stream>>>(
            x.data<T>(), add, norm.data<TY>(), mean, var, scale, bias, d.rows, d.cols, eps);
        MIX_CUDA_CHECK(cudaGetLastError());
      });
    });
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("fused_add_layer_norm", fused_add_layer_norm_cuda);

}  // namespace
}  // namespace mix::cuda
