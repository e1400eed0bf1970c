// batch_norm and batch_norm_grad on CUDA: the slots, attributes and semantics
// of runtime/ops/batch_norm.cc, through cuDNN's spatial batch normalization
// (statistics per channel over N and the spatial dims). X [N, C, spatial...]
// is described to cuDNN as NCHW [N, C, prod(spatial), 1]; with data_layout
// NHWC, X [N, spatial..., C] is NHWC [N, C, prod(spatial), 1].
//
// Numerics: Scale, Bias, the running and the saved statistics are FP32 for
// FP16 X as well (cuDNN derives an FP32 parameter descriptor from a half X);
// cuDNN accumulates in FP32 and rounds Y and dX once on store.
//   SavedVariance  = 1 / sqrt(var + eps), cuDNN's "saved inverse variance".
//   running stats  = momentum * running + (1 - momentum) * batch (Paddle's
//                    convention): cuDNN's exponentialAverageFactor is 1 - momentum,
//                    and cuDNN's running variance takes the unbiased batch
//                    variance, as the CPU kernel and PyTorch do.
// CUDNN_BATCHNORM_SPATIAL by default. SPATIAL_PERSISTENT (cuda::batch_norm_persistent,
// --cudnn-bn-persistent) is often faster, above all channels last in FP16,
// but cuDNN warns that it limits the range of values (TensorFlow's comment
// blames scaled integer atomics that can overflow); Paddle and TensorFlow
// keep it behind a flag too. Training forward and backward use the same mode;
// evaluation always uses SPATIAL.
//
// Evaluation (ctx.env.training false, or attr is_test) normalises with the
// running statistics and writes nothing but Y, as the CPU kernel.
//
// Channels last runs on mixtrain's own kernels (batch_norm_channels_last.cuh):
// cuDNN 9's non-persistent NHWC batch norm took most of a ResNet-50 AMP step
// on the GPU check (docs/gpu.md), batch_norm_grad most of all.
// --cudnn-bn-persistent keeps cuDNN's persistent kernels for the batch norms
// without fuse_with_relu, to compare. NCHW (FP32 runs by default) stays on
// cuDNN's SPATIAL kernels.
//
// fuse_with_relu (runtime/passes/fuse_bn_relu.h), with or without a residual Z
// added before the relu: channels last, the own kernels apply relu as they
// write Y, and the gradient recomputes relu's mask from X, as the CPU kernel
// does, so neither relu's input nor its gradient is ever stored. NCHW applies
// relu, and relu's gradient from Y, in separate kernels after cuDNN: the same
// traffic as the unfused ops.
#include <string>

#include "runtime/core/check.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/cudnn_util.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/functors.h"
#include "runtime/ops/batch_norm_shapes.h"
#include "runtime/ops/cuda/batch_norm_channels_last.cuh"
#include "runtime/ops/cuda/device_ops.cuh"

namespace mix {
namespace {

// ---- kernels ---------------------------------------------------------------------------

// NumBatchesTrackedOut = NumBatchesTracked + 1 (one element; out may alias in).
struct IncrementCounter {
  const int64_t* in;
  int64_t* out;
  __device__ void operator()(int64_t) const { out[0] = in[0] + 1; }
};

// ---- launchers ---------------------------------------------------------------------------

// Whether a batch_norm (or its gradient) runs on mixtrain's channels-last
// kernels rather than cuDNN: channels last, unless --cudnn-bn-persistent
// asks for cuDNN's persistent kernels (for the batch norms without a fused
// relu: mixtrain calls none of cuDNN's relu fusions).
bool use_own_kernels(const BatchNormDims& d, bool relu) {
  return d.channels_last && (relu || !cuda::batch_norm_persistent());
}

// The mode of a pass: training (forward and backward) may be persistent.
cudnnBatchNormMode_t mode_for(bool training) {
  return training && cuda::batch_norm_persistent() ? CUDNN_BATCHNORM_SPATIAL_PERSISTENT : CUDNN_BATCHNORM_SPATIAL;
}

// X's descriptor ([n, c, spatial, 1]) and the FP32 [1, c, 1, 1] descriptor cuDNN derives from it.
struct Descriptors {
  cuda::TensorDescriptor x;
  cuda::TensorDescriptor params;
};

Descriptors make_descriptors(const BatchNormDims& d, DType t, cudnnBatchNormMode_t mode, const char* op) {
  Descriptors s{cuda::image_tensor(t, d.n, d.c, d.spatial, 1, d.channels_last, op), cuda::TensorDescriptor{}};
  MIX_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(s.params.get(), s.x.get(), mode));
  return s;
}

// An FP32 [c] input on the op's device (Scale, Bias, the statistics).
const Tensor& channel_input(const OpContext& ctx, const std::string& slot, int64_t c) {
  const Tensor& t = ctx.in(slot);
  MIX_CHECK(t.dtype() == DType::f32 && t.shape() == Shape{c}, ctx.op.type << ": " << slot << " must be f32[" << c
                                                                           << "], got " << dtype_name(t.dtype())
                                                                           << shape_str(t.shape()));
  cuda::check_on_device(ctx, t, slot);
  return t;
}

// An output the kernel writes through a raw pointer must live on the op's device.
Tensor& device_output(OpContext& ctx, const std::string& slot, const Shape& shape, DType dtype) {
  Tensor& t = ctx.out(slot, shape, dtype);
  MIX_CHECK(t.numel() == 0 || t.device() == ctx.env.device,
            ctx.op.type << ": output " << slot << " is on " << t.device().str() << ", expected "
                        << ctx.env.device.str());
  return t;
}

// Training forward through cuDNN: Y, the saved and the running statistics.
void run_cudnn_train_forward(OpContext& ctx, const Tensor& x, const BatchNormDims& d, const Tensor& scale,
                             const Tensor& bias, const Tensor& rmean, const Tensor& rvar, float momentum, float eps,
                             Tensor& mean_out, Tensor& var_out, Tensor& saved_mean, Tensor& saved_inv_std,
                             cudaStream_t stream) {
  cuda::DeviceContext& dc = cuda::use_device(ctx.env.device.index);
  // cuDNN updates the running statistics in place. MeanOut is normally Mean
  // itself; when it is another variable it starts as a copy of Mean.
  cuda::copy_on_stream(mean_out.raw(), rmean.raw(), rmean.bytes(), stream);
  cuda::copy_on_stream(var_out.raw(), rvar.raw(), rvar.bytes(), stream);
  Tensor& y = device_output(ctx, "Y", x.shape(), x.dtype());
  const cudnnBatchNormMode_t mode = mode_for(true);
  const Descriptors s = make_descriptors(d, x.dtype(), mode, "batch_norm");
  MIX_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      cuda::cudnn_handle(dc), mode, &cuda::kCudnnOne, &cuda::kCudnnZero, s.x.get(), x.raw(), s.x.get(), y.raw(),
      s.params.get(), scale.raw(), bias.raw(), 1.0 - static_cast<double>(momentum), mean_out.raw(), var_out.raw(),
      static_cast<double>(eps), saved_mean.raw(), saved_inv_std.raw()));
}

// NumBatchesTrackedOut = NumBatchesTracked + 1, when the op has them.
void count_batch(OpContext& ctx, cudaStream_t stream) {
  if (ctx.wants("NumBatchesTrackedOut")) {
    const Tensor seen = ctx.in("NumBatchesTracked");
    MIX_CHECK(seen.dtype() == DType::i64 && seen.numel() == 1,
              "batch_norm: NumBatchesTracked must be an i64 scalar, got " << dtype_name(seen.dtype())
                                                                          << shape_str(seen.shape()));
    cuda::check_on_device(ctx, seen, "NumBatchesTracked");
    Tensor& seen_out = device_output(ctx, "NumBatchesTrackedOut", {}, DType::i64);
    cuda::launch_grid_stride(1, stream, IncrementCounter{seen.data<int64_t>(), seen_out.data<int64_t>()});
  }
}

void batch_norm_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  cuda::check_on_device(ctx, x, "X");
  const BatchNormDims d = batch_norm_dims(x.shape(), batch_norm_channels_last(ctx.op));
  const Tensor& scale = channel_input(ctx, "Scale", d.c);
  const Tensor& bias = channel_input(ctx, "Bias", d.c);
  const Tensor& rmean = channel_input(ctx, "Mean", d.c);
  const Tensor& rvar = channel_input(ctx, "Variance", d.c);
  const float eps = ctx.attr<float>("epsilon", 1e-5f);
  const bool training = ctx.env.training && !ctx.attr<bool>("is_test", false);
  const bool relu = ctx.attr<bool>("fuse_with_relu", false);
  const bool own_kernels = use_own_kernels(d, relu);
  cuda::DeviceContext& dc = cuda::use_device(ctx.env.device.index);
  const cudaStream_t stream = dc.compute.get();
  const cuda::BnChannelParams params{scale.data<float>(), bias.data<float>()};
  const Tensor* z = ctx.in_opt("Z");  // the residual added before relu
  if (z) {
    MIX_CHECK(relu && z->shape() == x.shape() && z->dtype() == x.dtype(),
              "batch_norm: a residual Z must match X and needs fuse_with_relu (runtime/passes/fuse_bn_relu.h)");
    cuda::check_on_device(ctx, *z, "Z");
  }
  // After cuDNN (NCHW): relu, or the residual add and relu, as separate kernels.
  auto activate = [&](Tensor& y) {
    if (z)
      cuda::binary_tensor(ctx, y, *z, y, fn::AddRelu{});
    else if (relu)
      cuda::unary_tensor(ctx, y, y, fn::ReluFwd{});
  };

  if (!training) {
    Tensor& y = device_output(ctx, "Y", x.shape(), x.dtype());
    if (x.numel() == 0) return;
    if (own_kernels)
      return cuda::bn_channels_last_eval_forward(x, d, params, rmean.data<float>(), rvar.data<float>(), eps, relu, z, y,
                                                 stream);
    const cudnnBatchNormMode_t mode = mode_for(false);
    const Descriptors s = make_descriptors(d, x.dtype(), mode, "batch_norm");
    MIX_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
        cuda::cudnn_handle(dc), mode, &cuda::kCudnnOne, &cuda::kCudnnZero, s.x.get(), x.raw(), s.x.get(), y.raw(),
        s.params.get(), scale.raw(), bias.raw(), rmean.raw(), rvar.raw(), static_cast<double>(eps)));
    activate(y);
    return;
  }

  const int64_t m = d.n * d.spatial;  // values per channel
  MIX_CHECK(m > 1, "batch_norm: training needs more than one value per channel, X is " << shape_str(x.shape())
                                                                                       << " (use a larger batch)");
  const float momentum = ctx.attr<float>("momentum", 0.9f);
  Tensor& saved_mean = device_output(ctx, "SavedMean", {d.c}, DType::f32);
  Tensor& saved_inv_std = device_output(ctx, "SavedVariance", {d.c}, DType::f32);
  Tensor& mean_out = device_output(ctx, "MeanOut", {d.c}, DType::f32);
  Tensor& var_out = device_output(ctx, "VarianceOut", {d.c}, DType::f32);
  if (own_kernels) {
    Tensor& y = device_output(ctx, "Y", x.shape(), x.dtype());
    cuda::bn_channels_last_train_forward(x, d, params, rmean.data<float>(), rvar.data<float>(), momentum, eps, relu, z,
                                         y, mean_out.data<float>(), var_out.data<float>(), saved_mean.data<float>(),
                                         saved_inv_std.data<float>(), stream);
  } else {
    run_cudnn_train_forward(ctx, x, d, scale, bias, rmean, rvar, momentum, eps, mean_out, var_out, saved_mean,
                            saved_inv_std, stream);
    activate(ctx.out("Y", x.shape(), x.dtype()));
  }
  count_batch(ctx, stream);
}

// dX = scale inv_std (dY - mean(dY) - xhat mean(dY xhat)), dScale = sum(dY xhat),
// dBias = sum(dY), with xhat from the forward's SavedMean and SavedVariance.
void batch_norm_grad_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  const Tensor dy = ctx.in("Y@GRAD");
  cuda::check_on_device(ctx, x, "X");
  cuda::check_on_device(ctx, dy, "Y@GRAD");
  const BatchNormDims d = batch_norm_dims(x.shape(), batch_norm_channels_last(ctx.op));
  MIX_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype(), "batch_norm_grad: Y@GRAD must match X");
  const Tensor& scale = channel_input(ctx, "Scale", d.c);
  const Tensor& saved_mean = channel_input(ctx, "SavedMean", d.c);
  const Tensor& saved_inv_std = channel_input(ctx, "SavedVariance", d.c);
  const float eps = ctx.attr<float>("epsilon", 1e-5f);
  const bool relu = ctx.attr<bool>("fuse_with_relu", false);
  const Device dev = ctx.env.device;
  cuda::DeviceContext& dc = cuda::use_device(dev.index);

  // cuDNN writes all three results: a gradient nobody wants goes to scratch
  // (X@GRAD's only for cuDNN: mixtrain's kernels skip it).
  const bool own_kernels = use_own_kernels(d, relu);
  Tensor scratch_dx, scratch_dscale, scratch_dbias;
  auto result = [&](const char* slot, const Shape& shape, DType dtype, Tensor& scratch) -> Tensor& {
    if (ctx.wants(slot)) return device_output(ctx, slot, shape, dtype);
    if (!own_kernels || std::string(slot) != "X@GRAD") scratch = Tensor::empty(shape, dtype, dev);
    return scratch;
  };
  Tensor& dx = result("X@GRAD", x.shape(), x.dtype(), scratch_dx);
  Tensor& dscale = result("Scale@GRAD", {d.c}, DType::f32, scratch_dscale);
  Tensor& dbias = result("Bias@GRAD", {d.c}, DType::f32, scratch_dbias);
  if (d.n * d.spatial == 0) {  // no values: the parameter gradients are empty sums
    MIX_CUDA_CHECK(cudaMemsetAsync(dscale.raw(), 0, dscale.bytes(), dc.compute.get()));
    MIX_CUDA_CHECK(cudaMemsetAsync(dbias.raw(), 0, dbias.bytes(), dc.compute.get()));
    return;
  }
  if (own_kernels) {  // with relu, dY is relu's output gradient and the mask comes from X (and Bias)
    const float* bias = relu ? channel_input(ctx, "Bias", d.c).data<float>() : nullptr;
    cuda::bn_channels_last_backward(x, dy, d, {scale.data<float>(), bias}, saved_mean.data<float>(),
                                    saved_inv_std.data<float>(), relu, ctx.wants("X@GRAD") ? &dx : nullptr,
                                    dscale.data<float>(), dbias.data<float>(), dc.compute.get());
    return;
  }
  // NCHW with fuse_with_relu: relu's gradient from Y into a scratch dY first.
  Tensor masked_dy;
  if (relu) {
    const Tensor y = ctx.in("Y");
    cuda::check_on_device(ctx, y, "Y");
    MIX_CHECK(y.shape() == x.shape() && y.dtype() == x.dtype(), "batch_norm_grad: Y must match X");
    masked_dy = Tensor::empty(dy.shape(), dy.dtype(), dev);
    cuda::binary_tensor(ctx, y, dy, masked_dy, fn::ReluBwd{});
  }
  const Tensor& dy_in = relu ? masked_dy : dy;
  const cudnnBatchNormMode_t mode = mode_for(true);
  const Descriptors s = make_descriptors(d, x.dtype(), mode, "batch_norm_grad");
  MIX_CUDNN_CHECK(cudnnBatchNormalizationBackward(
      cuda::cudnn_handle(dc), mode, &cuda::kCudnnOne, &cuda::kCudnnZero, &cuda::kCudnnOne, &cuda::kCudnnZero, s.x.get(),
      x.raw(), s.x.get(), dy_in.raw(), s.x.get(), dx.raw(), s.params.get(), scale.raw(), dscale.raw(), dbias.raw(),
      static_cast<double>(eps), saved_mean.raw(), saved_inv_std.raw()));
}

const bool registered = OpRegistry::instance().add_cuda_kernel("batch_norm", batch_norm_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("batch_norm_grad", batch_norm_grad_cuda);

}  // namespace
}  // namespace mix
