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
//
// The bodies are in update_kernels.cuh.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/cuda/multi_tensor.cuh"
#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/optim/cuda/update_kernels.cuh"
#include "runtime/optim/update_op.h"

namespace mix::optim {
namespace {

using cuda::ScalarRef;

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
      cuda::SgdChunk{learning_rate_on_device(ctx), skip_flag(ctx), ctx.attr<float>("weight_decay", 0.f)});
}

void momentum_cuda(OpContext& ctx) {
  const cuda::TensorList<3> u = update_tensors<3>(ctx, {"VelocityOut"});
  cuda::launch_multi_tensor<3>(
      u, cuda::compute_stream(ctx),
      cuda::MomentumChunk{learning_rate_on_device(ctx), skip_flag(ctx), ctx.attr<float>("mu", 0.9f),
                          ctx.attr<float>("weight_decay", 0.f), ctx.attr<bool>("use_nesterov", false)});
}

void adamw_cuda(OpContext& ctx) {
  const cuda::TensorList<4> u = update_tensors<4>(ctx, {"Moment1Out", "Moment2Out"});
  const Tensor& step = ctx.in("Step");
  MIX_CHECK(step.dtype() == DType::i64 && step.numel() == 1,
            "adamw: Step must be i64 [1], got " << dtype_name(step.dtype()) << shape_str(step.shape()));
  cuda::check_on_device(ctx, step, "Step");
  cuda::launch_multi_tensor<4>(
      u, cuda::compute_stream(ctx),
      cuda::AdamWChunk{learning_rate_on_device(ctx), step.data<int64_t>(), skip_flag(ctx),
                       ctx.attr<double>("beta1", 0.9), ctx.attr<double>("beta2", 0.999),
                       ctx.attr<float>("epsilon", 1e-8f), ctx.attr<float>("weight_decay", 0.01f)});
}

void increment_step_cuda(OpContext& ctx) {
  Tensor& step = ctx.out_existing("StepOut");
  MIX_CHECK(step.dtype() == DType::i64 && step.numel() == 1,
            "increment_step: StepOut must be i64 [1], got " << dtype_name(step.dtype()) << shape_str(step.shape()));
  cuda::check_on_device(ctx, step, "StepOut");
  cuda::launch_grid_stride(1, cuda::compute_stream(ctx), cuda::IncrementStep{step.data<int64_t>(), skip_flag(ctx)});
}

const bool registered = OpRegistry::instance().add_cuda_kernel("sgd", sgd_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("momentum", momentum_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("adamw", adamw_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("increment_step", increment_step_cuda);

}  // namespace
}  // namespace mix::optim
