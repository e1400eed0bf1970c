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
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/cuda/cudnn_util.h"  // device_workspace
#include "runtime/cuda/multi_tensor.cuh"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/device_ops.cuh"

namespace mix::cuda {
namespace {

// Elements a partial sum covers: divides both multi_tensor::kChunk and kAloneChunk,
// so a block's range is whole runs (the last one of a tensor cut short).
constexpr int64_t kRun = 1024;
static_assert(multi_tensor::kChunk % kRun == 0 && multi_tensor::kAloneChunk % kRun == 0);

// Block-wide sum of one value per thread (kMultiTensorThreads of them), in a fixed tree.
__device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = kMultiTensorThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();  // the next call may overwrite shared[]
  return total;
}

// Slot pointers: the gradient, and its tensor's first partial-sum slot.
struct SquareSums {
  __device__ void operator()(const TensorSlot<2>& s, int64_t begin, int64_t end) const {
    __shared__ double shared[kMultiTensorThreads];
    const float* x = static_cast<const float*>(s.ptr[0]);
    double* partial = static_cast<double*>(s.ptr[1]);
    for (int64_t run = begin; run < end; run += kRun) {
      const int64_t run_end = min(run + kRun, end);
      double v = 0;
      for (int64_t i = run + threadIdx.x; i < run_end; i += blockDim.x) v += static_cast<double>(x[i]) * x[i];
      const double total = block_sum(v, shared);
      if (threadIdx.x == 0) partial[run / kRun] = total;
    }
  }
};

// One block: norm = sqrt(sum of the partial sums), in a fixed order.
__global__ void __launch_bounds__(kMultiTensorThreads) finish_norm(const double* partial, int64_t n, float* norm) {
  __shared__ double shared[kMultiTensorThreads];
  double v = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v += partial[i];
  const double total = block_sum(v, shared);
  if (threadIdx.x == 0) *norm = static_cast<float>(sqrt(total));
}

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

// found_out = (found_in or 0) | !isfinite(norm): the flag of the AMP step, or the clip's own in FP32.
__global__ void raise_if_not_finite(const float* norm, const int32_t* found_in, int32_t* found_out) {
  *found_out = (found_in ? *found_in : 0) | (fn::is_finite(*norm) ? 0 : 1);
}

// Slot pointer: the gradient, scaled in place by the clip coefficient (nothing on a non-finite norm).
struct ScaleByCoefficient {
  const float* norm;
  float max_norm;
  __device__ void operator()(const TensorSlot<1>& s, int64_t begin, int64_t end) const {
    const float n = *norm;
    if (!fn::is_finite(n)) return;
    const float coef = fn::clip_coefficient(n, max_norm);
    float* g = static_cast<float*>(s.ptr[0]);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) g[i] = g[i] * coef;
  }
};

void clip_by_global_norm_cuda(OpContext& ctx) {
  const Tensor& norm = ctx.in("Norm");
  check_on_device(ctx, norm, "Norm");
  const Tensor* before = ctx.in_opt("FoundInfinite");
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

struct ClampChunk {
  fn::ClipByValue f;
  __device__ void operator()(const TensorSlot<1>& s, int64_t begin, int64_t end) const {
    float* g = static_cast<float*>(s.ptr[0]);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) g[i] = f(g[i]);
  }
};

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
