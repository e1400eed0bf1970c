#pragma once
// mixtrain's own batch_norm kernels for channels-last X ([M, C], M = N x
// spatial values per channel, channels adjacent in memory), with relu fused
// or not. runtime/ops/cuda/batch_norm.cu runs them for batch_norm with
// fuse_with_relu in NHWC (runtime/passes/fuse_bn_relu.h); cuDNN has no relu fusion
// outside its persistent mode. The math is the CPU kernel's
// (runtime/ops/batch_norm.cc) through the same functors: fn::bn_batch_stats,
// fn::BnNormalizeAct, fn::BnReluGradFromX, fn::BnBackward.
//
// Passes, each reading X once:
//   forward   1. per-chunk FP32 sums of x - shift and its square, per channel
//             2. per channel: the chunks' sums in double -> saved and running
//                statistics
//             3. y = relu?(normalize(x)), rounded once
//   backward  1. per-chunk FP32 sums of g and g xhat (g: dy through relu's
//                gradient, its mask recomputed from x)
//             2. per channel: the chunks' sums in double -> Scale@GRAD,
//                Bias@GRAD and the means step 3 needs
//             3. dx = BnBackward(x, g)
// Results depend only on the shapes (fixed chunks, fixed reduction trees),
// never on the GPU or on timing.
#include <cuda_runtime.h>

#include "runtime/core/tensor.h"
#include "runtime/ops/batch_norm_shapes.h"

namespace mix::cuda {

/// The per-channel FP32 tensors of a batch_norm, as device pointers.
struct BnChannelParams {
  const float* scale;
  const float* bias;
};

/// Training forward: writes y = relu?(normalize(x)), or with a residual z
/// (x's shape and dtype) y = relu(round(normalize(x)) + z) (fn::BnAddRelu);
/// saved_mean, saved_inv_std (1 / sqrt(var + eps)) and the running statistics
/// (mean_out = momentum running_mean + (1 - momentum) batch mean, likewise the
/// unbiased variance; mean_out may alias running_mean). Needs d.n * d.spatial > 1.
void bn_channels_last_train_forward(const Tensor& x, const BatchNormDims& d, BnChannelParams p,
                                    const float* running_mean, const float* running_var, float momentum, float eps,
                                    bool relu, const Tensor* z, Tensor& y, float* mean_out, float* var_out,
                                    float* saved_mean, float* saved_inv_std, cudaStream_t stream);

/// Evaluation forward: y as above, with the running statistics.
void bn_channels_last_eval_forward(const Tensor& x, const BatchNormDims& d, BnChannelParams p,
                                   const float* running_mean, const float* running_var, float eps, bool relu,
                                   const Tensor* z, Tensor& y, cudaStream_t stream);

/// Backward of the training forward from its saved statistics; dy is the
/// gradient of y (relu's output when `relu`). dx may be null (not wanted);
/// dscale and dbias are always written. Needs d.n * d.spatial > 0.
void bn_channels_last_backward(const Tensor& x, const Tensor& dy, const BatchNormDims& d, BnChannelParams p,
                               const float* saved_mean, const float* saved_inv_std, bool relu, Tensor* dx,
                               float* dscale, float* dbias, cudaStream_t stream);

}  // namespace mix::cuda
