// CUDA kernels of dropout and dropout_grad (upscale_in_train). The mask bit of
// element i is fn::dropout_keep(key, i, p), a stateless hash of (key, i), and
// the key is dropout_rules::mask_key (attr seed, ExecEnv::step, ExecEnv::rank,
// Out's name; made on the device from ExecEnv::device_step when that is set):
// the same function and the same key as the CPU kernel
// (runtime/ops/dropout.cc), so the GPU's Mask is the CPU's bit for bit, and
// Out = X * keep * (1 / (1 - p)) is one multiply by the same float on both:
// identical too. Whether anything is dropped (training, not is_test, p > 0)
// is decided by the same dropout_rules::active; otherwise Out is a copy of X
// and Mask all ones. The kernels: dropout_kernels.cuh.
#include <cstdint>

#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/cuda/dropout_kernels.cuh"
#include "runtime/ops/dropout_attrs.h"

namespace mix::cuda {
namespace {

// ---- launchers -----------------------------------------------------------------------

void dropout_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");  // by value: Out may replace X's scope entry
  check_on_device(ctx, x, "X");
  MIX_CHECK(is_floating(x.dtype()), "dropout: X must be a float tensor, got " << dtype_name(x.dtype()));
  const float p = dropout_rules::drop_prob(ctx.op);
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  uint8_t* mask = ctx.wants("Mask") ? ctx.out("Mask", x.shape(), DType::u8).data<uint8_t>() : nullptr;
  const int64_t n = x.numel();
  if (n == 0) return;
  const cudaStream_t stream = compute_stream(ctx);
  if (!dropout_rules::active(ctx, p)) {
    copy_on_stream(out.raw(), x.raw(), x.bytes(), stream);
    if (mask) MIX_CUDA_CHECK(cudaMemsetAsync(mask, 1, static_cast<size_t>(n), stream));
    return;
  }
  // With the step in device memory (a recorded step), the key is made on the
  // device, into scratch, by one thread; otherwise on the host.
  Tensor key_scratch;
  const uint64_t* key_on_device = nullptr;
  if (ctx.env.device_step) {
    key_scratch = Tensor::empty({1}, DType::i64, ctx.env.device);
    auto* key = static_cast<uint64_t*>(key_scratch.raw());
    const dropout_rules::MaskKeyParts parts = dropout_rules::mask_key_parts(ctx);
    launch_grid_stride(1, stream,
                       DropoutMaskKeyOnDevice{ctx.env.device_step, parts.seed, parts.rank, parts.name_hash, key});
    key_on_device = key;
  }
  const uint64_t key = key_on_device ? 0 : dropout_rules::mask_key(ctx, ctx.env.step);
  const fn::DropoutApply f{fn::dropout_scale(p)};
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch_grid_stride(n, stream, DropoutForward<T>{x.data<T>(), out.data<T>(), mask, key, key_on_device, p, f});
  });
}

void dropout_grad_cuda(OpContext& ctx) {
  const Tensor mask = ctx.in("Mask");
  const Tensor dout = ctx.in("Out@GRAD");
  dropout_rules::check_grad_inputs(mask, dout);
  check_on_device(ctx, mask, "Mask");
  check_on_device(ctx, dout, "Out@GRAD");
  MIX_CHECK(is_floating(dout.dtype()),
            "dropout_grad: Out@GRAD must be a float tensor, got " << dtype_name(dout.dtype()));
  const float p = dropout_rules::drop_prob(ctx.op);
  Tensor& dx = ctx.out("X@GRAD", dout.shape(), dout.dtype());
  if (dout.numel() == 0) return;
  const cudaStream_t stream = compute_stream(ctx);
  if (!dropout_rules::active(ctx, p)) {
    copy_on_stream(dx.raw(), dout.raw(), dout.bytes(), stream);
    return;
  }
  const fn::DropoutApply f{fn::dropout_scale(p)};
  dispatch_floating(dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch_grid_stride(dout.numel(), stream, DropoutBackward<T>{dout.data<T>(), mask.data<uint8_t>(), dx.data<T>(), f});
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("dropout", dropout_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("dropout_grad", dropout_grad_cuda);

}  // namespace
}  // namespace mix::cuda
