// CUDA kernels of the optimizer ops sgd, momentum, adamw and increment_step:
// the update functors of runtime/kernels/functors.h on FP32 masters.
//
// Nothing here reads device memory from the host. The learning rate, the
// SkipUpdate flag (the step's global found_inf) and optimizer.step are read by
// the kernels themselves: a skipped step is a kernel that returns at once, and
// AdamW's bias corrections are computed on the device, in double, from the
// step count in device memory (fn::adamw_update_for_step, once per block).
//
// Unlike the CPU kernel, adamw cannot report optimizer.step < 1 (increment_step
// did not run first) without a host round trip; Optimizer::append_update_ops
// always puts increment_step first.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/cuda/multi_tensor.cuh"
#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/optim/update_op.h"

namespace mix::optim {
namespace {

using cuda::ScalarRef;

// ---- kernels: the bodies of multi-tensor launches ----------------------------------------
// One update op updates a group of parameters (runtime/optim/update_op.h); the
// launches cover them all (runtime/cuda/multi_tensor.cuh): up to 128 parameters
// share a launch, only very large ones get one each, so ~160 ResNet-50
// parameters cost two launches instead of 160. Every thread of a block calls the body.

// Slots: param, grad.
struct SgdChunk {
  const float* lr;
  ScalarRef skip;
  float weight_decay;
  __device__ void operator()(const cuda::TensorSlot<2>& s, int64_t begin, int64_t end) const {
    if (cuda::flag_set(skip)) return;
    float* p = static_cast<float*>(s.ptr[0]);
    const float* g = static_cast<const float*>(s.ptr[1]);
    const fn::SgdUpdate update{*lr, weight_decay};
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) update(p[i], g[i]);
  }
};

// Slots: param, velocity, grad.
struct MomentumChunk {
  const float* lr;
  ScalarRef skip;
  float mu, weight_decay;
  bool nesterov;
  __device__ void operator()(const cuda::TensorSlot<3>& s, int64_t begin, int64_t end) const {
    if (cuda::flag_set(skip)) return;
    float* p = static_cast<float*>(s.ptr[0]);
    float* velocity = static_cast<float*>(s.ptr[1]);
    const float* g = static_cast<const float*>(s.ptr[2]);
    const fn::MomentumUpdate update{*lr, mu, weight_decay, nesterov};
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) update(p[i], velocity[i], g[i]);
  }
};

// Slots: param, m, v, grad.
struct AdamWChunk {
  const float* lr;
  const int64_t* step;  // optimizer.step, already advanced by increment_step
  ScalarRef skip;
  double beta1, beta2;
  float eps, weight_decay;
  __device__ void operator()(const cuda::TensorSlot<4>& s, int64_t begin, int64_t end) const {
    // The step's constants, once per block: two double pows are worth sharing.
    __shared__ fn::AdamWUpdate shared_update;
    __shared__ bool skipped;
    if (threadIdx.x == 0) {
      skipped = cuda::flag_set(skip);
      if (!skipped) shared_update = fn::adamw_update_for_step(*lr, beta1, beta2, eps, weight_decay, *step);
    }
    __syncthreads();
    if (skipped) return;
    const fn::AdamWUpdate u = shared_update;
    float* p = static_cast<float*>(s.ptr[0]);
    float* m = static_cast<float*>(s.ptr[1]);
    float* v = static_cast<float*>(s.ptr[2]);
    const float* g = static_cast<const float*>(s.ptr[3]);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) u(p[i], m[i], v[i], g[i]);
  }
};

struct IncrementStep {
  int64_t* step;
  ScalarRef skip;
  __device__ void operator()(int64_t) const {
    if (!cuda::flag_set(skip)) step[0] += 1;
  }
};

// ---- launchers -----------------------------------------------------------------------

// SkipUpdate (optional), checked to be on the device.
ScalarRef skip_flag(const OpContext& ctx) {
  const Tensor* skip = ctx.in_opt("SkipUpdate");
  if (skip) {
    MIX_CHECK(skip->numel() == 1, ctx.op.type << ": SkipUpdate must hold one value, has " << shape_str(skip->shape()));
    cuda::check_on_device(ctx, *skip, "SkipUpdate");
  }
  return cuda::scalar_ref(skip);
}

// The learning rate, f32 [1] in device memory.
const float* learning_rate_on_device(const OpContext& ctx) {
  const Tensor& lr = ctx.in("LearningRate");
  MIX_CHECK(lr.dtype() == DType::f32 && lr.numel() == 1,
            ctx.op.type << ": LearningRate must be f32 [1], got " << dtype_name(lr.dtype()) << shape_str(lr.shape()));
  cuda::check_on_device(ctx, lr, "LearningRate");
  return lr.data<float>();
}

// The op's parameters, each with its state slots (outputs, in place) and its
// gradient, checked and on the device, as the pointer sets of a
// multi-tensor launch: {param, state slots..., grad}.
template <int kPointers>
cuda::TensorList<kPointers> update_tensors(OpContext& ctx, const std::array<const char*, kPointers - 2>& state_slots) {
  cuda::TensorList<kPointers> u;
  const size_t n = updated_count(ctx, std::vector<const char*>(state_slots.begin(), state_slots.end()));
  for (size_t k = 0; k < n; ++k) {
    auto [param, grad] = param_and_grad(ctx, k);
    cuda::check_on_device(ctx, *param, "Param '" + ctx.op.ins("Param").at(k) + "'");
    cuda::check_on_device(ctx, *grad, "Grad '" + ctx.op.ins("Grad").at(k) + "'");
    std::array<void*, kPointers> p{};
    p[0] = param->raw();
    for (int j = 0; j < kPointers - 2; ++j) {
      Tensor& state = state_of(ctx, state_slots[static_cast<size_t>(j)], k, *param);
      cuda::check_on_device(ctx, state, state_slots[static_cast<size_t>(j)]);
      p[static_cast<size_t>(j) + 1] = state.raw();
    }
    p[kPointers - 1] = const_cast<void*>(grad->raw());
    u.add(p, param->numel());
  }
  return u;
}

void sgd_cuda(OpContext& ctx) {
  const cuda::TensorList<2> u = update_tensors<2>(ctx, {});
  cuda::launch_multi_tensor<2>(
      u, cuda::compute_stream(ctx),
      SgdChunk{learning_rate_on_device(ctx), skip_flag(ctx), ctx.attr<float>("weight_decay", 0.f)});
}

void momentum_cuda(OpContext& ctx) {
  const cuda::TensorList<3> u = update_tensors<3>(ctx, {"VelocityOut"});
  cuda::launch_multi_tensor<3>(
      u, cuda::compute_stream(ctx),
      MomentumChunk{learning_rate_on_device(ctx), skip_flag(ctx), ctx.attr<float>("mu", 0.9f),
                    ctx.attr<float>("weight_decay", 0.f), ctx.attr<bool>("use_nesterov", false)});
}

void adamw_cuda(OpContext& ctx) {
  const cuda::TensorList<4> u = update_tensors<4>(ctx, {"Moment1Out", "Moment2Out"});
  const Tensor& step = ctx.in("Step");
  MIX_CHECK(step.dtype() == DType::i64 && step.numel() == 1,
            "adamw: Step must be i64 [1], got " << dtype_name(step.dtype()) << shape_str(step.shape()));
  cuda::check_on_device(ctx, step, "Step");
  cuda::launch_multi_tensor<4>(u, cuda::compute_stream(ctx),
                               AdamWChunk{learning_rate_on_device(ctx), step.data<int64_t>(), skip_flag(ctx),
                                          ctx.attr<double>("beta1", 0.9), ctx.attr<double>("beta2", 0.999),
                                          ctx.attr<float>("epsilon", 1e-8f), ctx.attr<float>("weight_decay", 0.01f)});
}

void increment_step_cuda(OpContext& ctx) {
  Tensor& step = ctx.out_existing("StepOut");
  MIX_CHECK(step.dtype() == DType::i64 && step.numel() == 1,
            "increment_step: StepOut must be i64 [1], got " << dtype_name(step.dtype()) << shape_str(step.shape()));
  cuda::check_on_device(ctx, step, "StepOut");
  cuda::launch_grid_stride(1, cuda::compute_stream(ctx), IncrementStep{step.data<int64_t>(), skip_flag(ctx)});
}

const bool registered = OpRegistry::instance().add_cuda_kernel("sgd", sgd_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("momentum", momentum_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("adamw", adamw_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("increment_step", increment_step_cuda);

}  // namespace
}  // namespace mix::optim
