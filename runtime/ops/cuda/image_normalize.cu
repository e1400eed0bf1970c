// CUDA kernel of image_normalize (runtime/ops/image_normalize.cc: slots,
// attributes, semantics): one thread per pixel of the batch reads its C bytes
// (a warp reads 32 * C contiguous bytes) and writes each channel's value where
// the output layout puts it, so the transpose to channels first, the
// normalisation and the rounding to Out's dtype are one pass over the batch.
// Channels first, a warp's writes of one channel are 32 consecutive values of
// one plane. Each value is fn::NormalizePixel's, the functor the CPU kernel
// and the host's normalize_image run (IEEE division and subtraction on both
// sides, nothing to contract), rounded on store with from_float<T> as the CPU
// does: the twins agree bit for bit. The kernel is in
// image_normalize_kernels.cuh.
#include <cstdint>

#include "runtime/ir/op_registry.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/cuda/image_normalize_kernels.cuh"
#include "runtime/ops/image_normalize_attrs.h"

namespace mix::cuda {
namespace {

// ---- launcher ------------------------------------------------------------------------

void image_normalize_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  check_on_device(ctx, x, "X");
  const image_normalize_rules::Params p = image_normalize_rules::params(ctx.op, x.dtype(), x.shape());
  Tensor& out = ctx.out("Out", image_normalize_rules::out_shape(x.shape(), p.channels_last), p.out_dtype);
  const int64_t pixels = x.dim(1) * x.dim(2);
  const cudaStream_t stream = compute_stream(ctx);
  dispatch_floating(p.out_dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_grid_stride(x.dim(0) * pixels, stream, NormalizePixels<T>{x.data<uint8_t>(), out.data<T>(), p, pixels});
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("image_normalize", image_normalize_cuda);

}  // namespace
}  // namespace mix::cuda
