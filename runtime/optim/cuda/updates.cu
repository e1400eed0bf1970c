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
#include <cstdint>

#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/optim/update_op.h"

namespace mix::optim {
namespace {

using cuda::ScalarRef;

// ---- kernels -------------------------------------------------------------------------

struct SgdMap {
  float* p;
  const float* g;
  const float* lr;
  ScalarRef skip;
  float weight_decay;
  __device__ void operator()(int64_t i) const {
    if (cuda::flag_set(skip)) return;
    const fn::SgdUpdate update{*lr, weight_decay};
    update(p[i], g[i]);
  }
};

struct MomentumMap {
  float* p;
  float* velocity;
  const float* g;
  const float* lr;
  ScalarRef skip;
  float mu, weight_decay;
  bool nesterov;
  __device__ void operator()(int64_t i) const {
    if (cuda::flag_set(skip)) return;
    const fn::MomentumUpdate update{*lr, mu, weight_decay, nesterov};
    update(p[i], velocity[i], g[i]);
  }
};

struct AdamWArgs {
  float* p;
  float* m;
  float* v;
  const float* g;
  int64_t n;
  const float* lr;
  const int64_t* step;  // optimizer.step, already advanced by increment_step
  ScalarRef skip;
  double beta1, beta2;
  float eps, weight_decay;
};

__global__ void adamw_kernel(AdamWArgs a) {
  // The step's constants, once per block: two double pows are worth sharing.
  __shared__ fn::AdamWUpdate update;
  __shared__ bool skip;
  if (threadIdx.x == 0) {
    skip = cuda::flag_set(a.skip);
    if (!skip) update = fn::adamw_update_for_step(*a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, *a.step);
  }
  __syncthreads();
  if (skip) return;
  const fn::AdamWUpdate u = update;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    u(a.p[i], a.m[i], a.v[i], a.g[i]);
}

struct IncrementStep {
  int64_t* step;
  ScalarRef skip;
  __device__ void operator()(int64_t) const {
    if (!cuda::flag_set(skip)) step[0] += 1;
  }
};

// ---- launchers -----------------------------------------------------------------------

/// SkipUpdate (optional), checked to be on the device.
ScalarRef skip_flag(const OpContext& ctx) {
  const Tensor* skip = ctx.in_opt("SkipUpdate");
  if (skip) {
    MIX_CHECK(skip->numel() == 1, ctx.op.type << ": SkipUpdate must hold one value, has " << shape_str(skip->shape()));
    cuda::check_on_device(ctx, *skip, "SkipUpdate");
  }
  return cuda::scalar_ref(skip);
}

/// The learning rate, f32 [1] in device memory.
const float* learning_rate_on_device(const OpContext& ctx) {
  const Tensor& lr = ctx.in("LearningRate");
  MIX_CHECK(lr.dtype() == DType::f32 && lr.numel() == 1,
            ctx.op.type << ": LearningRate must be f32 [1], got " << dtype_name(lr.dtype()) << shape_str(lr.shape()));
  cuda::check_on_device(ctx, lr, "LearningRate");
  return lr.data<float>();
}

/// An optimizer state slot (updated in place), checked against the parameter.
Tensor& state_slot(OpContext& ctx, const char* slot, const Tensor& param) {
  Tensor& t = ctx.out_existing(slot);
  MIX_CHECK(t.dtype() == DType::f32 && t.numel() == param.numel(),
            ctx.op.type << ": " << slot << " " << dtype_name(t.dtype()) << shape_str(t.shape())
                        << " does not match the FP32 parameter " << shape_str(param.shape()));
  cuda::check_on_device(ctx, t, slot);
  return t;
}

void check_param_on_device(const OpContext& ctx, const Tensor& param, const Tensor& grad) {
  cuda::check_on_device(ctx, param, "Param");
  cuda::check_on_device(ctx, grad, "Grad");
}

void sgd_cuda(OpContext& ctx) {
  auto [param, grad] = param_and_grad(ctx);
  check_param_on_device(ctx, *param, *grad);
  const SgdMap f{param->data<float>(), grad->data<float>(), learning_rate_on_device(ctx), skip_flag(ctx),
                 ctx.attr<float>("weight_decay", 0.f)};
  cuda::launch_grid_stride(param->numel(), cuda::compute_stream(ctx), f);
}

void momentum_cuda(OpContext& ctx) {
  auto [param, grad] = param_and_grad(ctx);
  check_param_on_device(ctx, *param, *grad);
  Tensor& velocity = state_slot(ctx, "VelocityOut", *param);
  const MomentumMap f{param->data<float>(),
                      velocity.data<float>(),
                      grad->data<float>(),
                      learning_rate_on_device(ctx),
                      skip_flag(ctx),
                      ctx.attr<float>("mu", 0.9f),
                      ctx.attr<float>("weight_decay", 0.f),
                      ctx.attr<bool>("use_nesterov", false)};
  cuda::launch_grid_stride(param->numel(), cuda::compute_stream(ctx), f);
}

void adamw_cuda(OpContext& ctx) {
  auto [param, grad] = param_and_grad(ctx);
  check_param_on_device(ctx, *param, *grad);
  Tensor& m = state_slot(ctx, "Moment1Out", *param);
  Tensor& v = state_slot(ctx, "Moment2Out", *param);
  const Tensor& step = ctx.in("Step");
  MIX_CHECK(step.dtype() == DType::i64 && step.numel() == 1,
            "adamw: Step must be i64 [1], got " << dtype_name(step.dtype()) << shape_str(step.shape()));
  cuda::check_on_device(ctx, step, "Step");
  const int64_t n = param->numel();
  if (n == 0) return;
  const AdamWArgs a{param->data<float>(),
                    m.data<float>(),
                    v.data<float>(),
                    grad->data<float>(),
                    n,
                    learning_rate_on_device(ctx),
                    step.data<int64_t>(),
                    skip_flag(ctx),
                    ctx.attr<double>("beta1", 0.9),
                    ctx.attr<double>("beta2", 0.999),
                    ctx.attr<float>("epsilon", 1e-8f),
                    ctx.attr<float>("weight_decay", 0.01f)};
  adamw_kernel<<<cuda::grid_blocks(n), cuda::kBlock, 0, cuda::compute_stream(ctx)>>>(a);
  MIX_CUDA_CHECK(cudaGetLastError());
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
