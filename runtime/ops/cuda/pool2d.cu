// pool2d and pool2d_grad on CUDA: the slots, attributes and semantics of
// runtime/ops/pool2d.cc (pool_dims in runtime/ops/conv_shapes.h), through
// cuDNN pooling with descriptors in the op's data_format (NCHW or NHWC).
//   max: CUDNN_POOLING_MAX_DETERMINISTIC (the plain mode may scatter the
//        gradient with atomics), padding never wins (cuDNN skips it, as the
//        CPU's -inf does; pool_dims guarantees every window holds an input),
//        and CUDNN_PROPAGATE_NAN, as the CPU's "a NaN wins". cuDNN routes a
//        window's gradient to one maximum; which one among exact ties is not
//        documented (the CPU takes the first in row-major order), so only
//        inputs with ties can differ.
//   avg: COUNT_EXCLUDE_PADDING for `exclusive` (Paddle's default, the window's
//        in-bounds count), COUNT_INCLUDE_PADDING otherwise (kh kw). Windows
//        never reach past the padding (no ceil_mode), so kh kw is exact.
//   global_pooling: the window is the whole plane (pool_dims sets it).
// cuDNN accumulates in FP32 and rounds once on store, as the CPU kernel.
//
// The grad op has no Out slot (the CPU kernel finds the maxima again from X),
// but cuDNN's backward reads Out: it is recomputed into scratch first.
//
// No kernels of its own: this file is only the launcher part.
#include "runtime/core/check.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/cudnn_util.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/conv_shapes.h"
#include "runtime/ops/cuda/device_ops.cuh"

namespace mix {
namespace {

struct Descriptors {
  cuda::TensorDescriptor x, y;  // X [n, c, h, w], Out [n, c, oh, ow]
  cuda::PoolingDescriptor pool;
};

Descriptors make_descriptors(const PoolDims& d, DType t, const char* op) {
  Descriptors s{cuda::image_tensor(t, d.n, d.c, d.h, d.w, d.channels_last, op),
                cuda::image_tensor(t, d.n, d.c, d.oh, d.ow, d.channels_last, op), cuda::PoolingDescriptor{}};
  const cudnnPoolingMode_t mode = d.is_max      ? CUDNN_POOLING_MAX_DETERMINISTIC
                                  : d.exclusive ? CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING
                                                : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
  MIX_CUDNN_CHECK(cudnnSetPooling2dDescriptor(
      s.pool.get(), mode, CUDNN_PROPAGATE_NAN, cuda::cudnn_int(d.kh, op, "ksize"), cuda::cudnn_int(d.kw, op, "ksize"),
      cuda::cudnn_int(d.pad_h, op, "padding"), cuda::cudnn_int(d.pad_w, op, "padding"),
      cuda::cudnn_int(d.stride_h, op, "stride"), cuda::cudnn_int(d.stride_w, op, "stride")));
  // pool_dims decides the output size on every device; cuDNN must agree with it.
  int n = 0, c = 0, h = 0, w = 0;
  MIX_CUDNN_CHECK(cudnnGetPooling2dForwardOutputDim(s.pool.get(), s.x.get(), &n, &c, &h, &w));
  MIX_CHECK(n == d.n && c == d.c && h == d.oh && w == d.ow, op << ": cuDNN computes an output of [" << n << ", " << c
                                                               << ", " << h << ", " << w << "], pool_dims "
                                                               << shape_str(d.out_shape_nchw()));
  return s;
}

void pool2d_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  cuda::check_on_device(ctx, x, "X");
  const PoolDims d = pool_dims(ctx.op, x.shape());
  Tensor& out = ctx.out("Out", d.out_shape(), x.dtype());
  if (out.numel() == 0) return;
  cuda::DeviceContext& dc = cuda::use_device(ctx.env.device.index);
  const Descriptors s = make_descriptors(d, x.dtype(), "pool2d");
  MIX_CUDNN_CHECK(cudnnPoolingForward(cuda::cudnn_handle(dc), s.pool.get(), &cuda::kCudnnOne, s.x.get(), x.raw(),
                                      &cuda::kCudnnZero, s.y.get(), out.raw()));
}

void pool2d_grad_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  const Tensor dout = ctx.in("Out@GRAD");
  cuda::check_on_device(ctx, x, "X");
  cuda::check_on_device(ctx, dout, "Out@GRAD");
  const PoolDims d = pool_dims(ctx.op, x.shape());
  MIX_CHECK(dout.shape() == d.out_shape(), "pool2d_grad: Out@GRAD is " << shape_str(dout.shape()) << ", expected "
                                                                      << shape_str(d.out_shape()));
  MIX_CHECK(dout.dtype() == x.dtype(), "pool2d_grad: Out@GRAD is " << dtype_name(dout.dtype()) << " but X is "
                                                                   << dtype_name(x.dtype()));
  Tensor& dx = ctx.out("X@GRAD", x.shape(), x.dtype());
  if (dx.numel() == 0) return;
  cuda::DeviceContext& dc = cuda::use_device(ctx.env.device.index);
  cudnnHandle_t h = cuda::cudnn_handle(dc);
  const Descriptors s = make_descriptors(d, x.dtype(), "pool2d_grad");
  Tensor y = Tensor::empty(d.out_shape(), x.dtype(), ctx.env.device);  // the forward's Out, recomputed
  MIX_CUDNN_CHECK(cudnnPoolingForward(h, s.pool.get(), &cuda::kCudnnOne, s.x.get(), x.raw(), &cuda::kCudnnZero,
                                      s.y.get(), y.raw()));
  MIX_CUDNN_CHECK(cudnnPoolingBackward(h, s.pool.get(), &cuda::kCudnnOne, s.y.get(), y.raw(), s.y.get(), dout.raw(),
                                       s.x.get(), x.raw(), &cuda::kCudnnZero, s.x.get(), dx.raw()));
}

const bool registered = OpRegistry::instance().add_cuda_kernel("pool2d", pool2d_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("pool2d_grad", pool2d_grad_cuda);

}  // namespace
}  // namespace mix
