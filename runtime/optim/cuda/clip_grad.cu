// CUDA kernels of grad_global_norm, clip_by_global_norm and clip_by_value
// (runtime/optim/clip_grad.h: slots, attributes, semantics). Nothing comes
// back to the host: the norm is written on the device, and the clip reads it
// there.
//
// The norm is reproducible, as it must be (every rank clips by it, and ranks
// that disagreed would diverge): squares are summed in FP64, each run of 1024
// elements by one block in a fixed tree into its own slot (no atomics), then
// the slots by one block in a fixed order. The CPU kernel sums in FP64 in
// element order instead; both round the same FP64 sum to FP32 once, so they
// agree to an FP32 ulp (test_cuda_ops states the bound).
//
// The kernels and the multi-tensor bodies are in clip_grad_kernels.cuh, which
// the emulated test runs on the CPU; this file holds the launchers.
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/cuda/cudnn_util.h"  // device_workspace
#include "runtime/cuda/multi_tensor.cuh"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/optim/cuda/clip_grad_kernels.cuh"

namespace mix::cuda {
namespace {

void grad_global_norm_cuda(OpContext& ctx) {
  const std::vector<const Tensor*> xs = ctx.ins("X");
  std::vector<int64_t> first_slot;
  int64_t slots = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    check_on_device(ctx, *xs[i], ctx.op.ins("X")[i]);
    MIX_CHECK(xs[i]->dtype() == DType::f32, "grad_global_norm: " << ctx.op.ins("X")[i] << " must be FP32");
    first_slot.push_back(slots);
    slots += (xs[i]->numel() + kRun - 1) / kRun;
  }
  Tensor& norm = ctx.out("Norm", {1}, DType::f32);
  const cudaStream_t stream = compute_stream(ctx);
  Tensor partials = device_workspace(static_cast<size_t>(std::max<int64_t>(slots, 1)) * sizeof(double), ctx.env.device);
  auto* partial = static_cast<double*>(partials.raw());
  MIX_CUDA_CHECK(cudaMemsetAsync(partial, 0, static_cast<size_t>(std::max<int64_t>(slots, 1)) * sizeof(double), stream));
  TensorList<2> list;
  for (size_t i = 0; i < xs.size(); ++i) list.add({xs[i]->raw(), partial + first_slot[i]}, xs[i]->numel());
  launch_multi_tensor<2>(list, stream, SquareSums{});
  finish_norm<<<1, kMultiTensorThreads, 0, stream>>>(partial, slots, norm.data<float>());
  MIX_CUDA_CHECK(cudaGetLastError());
}

void clip_by_global_norm_cuda(OpContext& ctx) {
  const Tensor& norm = ctx.in("Norm");
  check_on_device(ctx, norm, "Norm");
  const Tensor* before = ctx.in_opt("FoundInfinite");
  if (before) check_on_device(ctx, *before, "FoundInfinite");
  Tensor& found = ctx.out("FoundInfiniteOut", {1}, DType::i32);
  const cudaStream_t stream = compute_stream(ctx);
  raise_if_not_finite<<<1, 1, 0, stream>>>(norm.data<float>(), before ? before->data<int32_t>() : nullptr,
                                            found.data<int32_t>());
  MIX_CUDA_CHECK(cudaGetLastError());
  TensorList<1> list;
  for (size_t i = 0; i < ctx.op.outs("Out").size(); ++i) {
    Tensor& g = ctx.out_existing("Out", i);
    check_on_device(ctx, g, ctx.op.outs("Out")[i]);
    list.add({g.raw()}, g.numel());
  }
  launch_multi_tensor<1>(list, stream,
                         ScaleByCoefficient{norm.data<float>(), static_cast<float>(ctx.attr<double>("max_norm", 0))});
}

void clip_by_value_cuda(OpContext& ctx) {
  TensorList<1> list;
  for (size_t i = 0; i < ctx.op.outs("Out").size(); ++i) {
    Tensor& g = ctx.out_existing("Out", i);
    check_on_device(ctx, g, ctx.op.outs("Out")[i]);
    list.add({g.raw()}, g.numel());
  }
  launch_multi_tensor<1>(list, compute_stream(ctx),
                         ClampChunk{fn::ClipByValue{static_cast<float>(ctx.attr<double>("max_value", 0))}});
}

const bool registered = OpRegistry::instance().add_cuda_kernel("grad_global_norm", grad_global_norm_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("clip_by_global_norm", clip_by_global_norm_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("clip_by_value", clip_by_value_cuda);

}  // namespace
}  // namespace mix::cuda
