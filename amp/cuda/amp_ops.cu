// CUDA kernels of the AMP ops: check_finite_and_unscale and its fused twin
// cast_check_finite_and_unscale (fn::UnscaleCheck), update_loss_scaling
// (amp::loss_scaling_step, the MIX_HD update LossScaler runs on the host) and
// the inject_overflow testing aid. Slots, attributes and semantics are those
// of the CPU ops in amp/*_op.cc.
//
// Host round trips. check_finite_and_unscale makes none: the flag is raised on
// the device (one integer atomicOr per block that saw a non-finite value,
// order-independent, hence reproducible) and read by whoever needs it, on the
// device too (the optimizer ops' SkipUpdate, update_loss_scaling). The
// optional FoundInfiniteEach (which X held an inf or NaN) is zeroed on the
// stream and raised the same way, one atomic per block into X's slot. The X
// are unscaled by multi-tensor launches (runtime/cuda/multi_tensor.cuh): up to
// 128 a launch, very large ones a launch each; so the X may run in any
// order, and an Out may be its own X (in place) but not another X. The CPU op
// refuses a scale that is not positive and finite; the device cannot throw, so
// such a scale raises found_inf instead: the step is skipped, not applied with
// inf/NaN gradients, and the dynamic scaler falls back to min_loss_scaling.
//
// update_loss_scaling runs the update in one device thread and makes no host
// round trip either. The CPU op throws the "stuck at the minimum" error
// itself; here that would mean reading a flag in the middle of the step, and
// the GPU would idle while the host then queued the optimizer updates one by
// one. The trainer instead calls amp::check_loss_scale_not_stuck after the
// step, when it reads the loss and found_inf anyway: the same error, from the
// same state, for a step that was skipped either way.
//
// The kernels and multi-tensor bodies are in amp_kernels.cuh.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "amp/cuda/amp_kernels.cuh"
#include "amp/loss_scaler.h"
#include "amp/loss_scaling_math.h"
#include "collective/communicator.h"
#include "runtime/cuda/multi_tensor.cuh"
#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/device_ops.cuh"

namespace mix::amp {
namespace {

// ---- check_finite_and_unscale ----------------------------------------------------------

void run_unscale(OpContext& ctx, bool to_f32) {
  const Tensor scale = ctx.in("Scale");
  MIX_CHECK(scale.dtype() == DType::f32 && scale.numel() == 1,
            ctx.op.type << ": Scale must be f32 [1], got " << dtype_name(scale.dtype()) << shape_str(scale.shape()));
  cuda::check_on_device(ctx, scale, "Scale");
  const Tensor* prev_p = ctx.in_opt("FoundInfiniteIn");
  Tensor prev;  // by value: FoundInfinite may be the same variable
  if (prev_p) {
    MIX_CHECK(prev_p->dtype() == DType::i32 && prev_p->numel() == 1,
              ctx.op.type << ": FoundInfiniteIn must be i32 [1]");
    cuda::check_on_device(ctx, *prev_p, "FoundInfiniteIn");
    prev = *prev_p;
  }
  const auto& x_names = ctx.op.ins("X");
  const auto& out_names = ctx.op.outs("Out");
  MIX_CHECK(x_names.size() == out_names.size(),
            ctx.op.type << ": X holds " << x_names.size() << " variables but Out holds " << out_names.size());

  const cudaStream_t stream = cuda::compute_stream(ctx);
  Tensor& found = ctx.out("FoundInfinite", {1}, DType::i32);
  int32_t* found_p = found.data<int32_t>();
  cuda::launch_grid_stride(1, stream,
                           InitFoundInf{found_p, prev_p ? cuda::scalar_ref(&prev) : ScalarRef{}, scale.data<float>()});
  // FoundInfiniteEach[i]: raised from X[i]'s values only, as on the CPU (not by
  // FoundInfiniteIn or an invalid scale); an empty X keeps its 0.
  int32_t* each_p = nullptr;
  if (ctx.wants("FoundInfiniteEach")) {
    Tensor& each = ctx.out("FoundInfiniteEach", {static_cast<int64_t>(x_names.size())}, DType::i32);
    each_p = each.data<int32_t>();
    if (each.bytes() > 0) MIX_CUDA_CHECK(cudaMemsetAsync(each_p, 0, each.bytes(), stream));
  }
  // The tensors grouped by (X dtype, Out dtype), one multi-tensor launch per
  // group; within a group, a tensor's index is its position in X, so that
  // FoundInfiniteEach is raised in X's slot.
  struct Group {
    DType in, out;
    cuda::TensorList<2> tensors;  // pointers: X, Out
  };
  std::vector<Group> groups;
  // Handles on every X until the launches are queued: an Out written before a
  // later X is read may replace a scope entry (then only these keep X's memory).
  std::vector<Tensor> inputs;
  inputs.reserve(x_names.size());
  for (size_t i = 0; i < x_names.size(); ++i) {
    const Tensor& x = inputs.emplace_back(ctx.scope.get(x_names[i]));
    const DType out_dtype = to_f32 ? DType::f32 : x.dtype();
    MIX_CHECK(out_names[i] != x_names[i] || out_dtype == x.dtype(), ctx.op.type << ": Out '" << out_names[i]
                                                                                << "' must be a new variable for "
                                                                                << dtype_name(x.dtype()) << " X");
    cuda::check_on_device(ctx, x, "X '" + x_names[i] + "'");
    Tensor& out = ctx.out("Out", x.shape(), out_dtype, i);
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const Group& k) { return k.in == x.dtype() && k.out == out_dtype; });
    if (g == groups.end()) g = groups.insert(groups.end(), Group{x.dtype(), out_dtype, {}});
    // Every X keeps its index (an empty one too: it gets no block, and its flag stays 0).
    g->tensors.put(i, {const_cast<void*>(x.raw()), out.raw()}, x.numel());
  }
  for (const Group& g : groups)
    cuda::dispatch_floating(g.in, [&](auto in_tag) {
      using In = decltype(in_tag);
      cuda::dispatch_floating(g.out, [&](auto out_tag) {
        using Out = decltype(out_tag);
        cuda::launch_multi_tensor<2>(g.tensors, stream,
                                     UnscaleCheckChunk<In, Out>{scale.data<float>(), found_p, each_p});
      });
    });
}

void check_finite_and_unscale_cuda(OpContext& ctx) { run_unscale(ctx, false); }
void cast_check_finite_and_unscale_cuda(OpContext& ctx) { run_unscale(ctx, true); }

// ---- update_loss_scaling ---------------------------------------------------------------

// A state input, by value (its output may replace the scope entry), checked.
Tensor state_input(const OpContext& ctx, const char* slot, DType dtype) {
  const Tensor t = ctx.in(slot);
  MIX_CHECK(t.numel() == 1, "update_loss_scaling: " << slot << " '" << ctx.op.in(slot) << "' must hold one value, has "
                                                    << shape_str(t.shape()));
  MIX_CHECK(t.dtype() == dtype,
            "update_loss_scaling: " << slot << " must be " << dtype_name(dtype) << ", not " << dtype_name(t.dtype()));
  cuda::check_on_device(ctx, t, slot);
  return t;
}

void update_loss_scaling_cuda(OpContext& ctx) {
  const LossScalerConfig config = from_op_attrs(ctx.op);
  const Tensor flag = ctx.in("FoundInfinite");
  MIX_CHECK(flag.numel() == 1, "update_loss_scaling: FoundInfinite '" << ctx.op.in("FoundInfinite")
                                                                      << "' must hold one value, has "
                                                                      << shape_str(flag.shape()));
  MIX_CHECK(flag.dtype() == DType::i32 || flag.dtype() == DType::i64 || flag.dtype() == DType::f32,
            "update_loss_scaling: FoundInfinite must be i32, i64 or f32, not " << dtype_name(flag.dtype()));
  cuda::check_on_device(ctx, flag, "FoundInfinite");
  const Tensor scale = state_input(ctx, "PrevLossScaling", DType::f32);
  const Tensor good = state_input(ctx, "InGoodSteps", DType::i64);
  const Tensor bad = state_input(ctx, "InBadSteps", DType::i64);
  const Tensor skipped = state_input(ctx, "Skipped", DType::i64);
  const Tensor at_min = state_input(ctx, "ConsecutiveSkipsAtMin", DType::i64);

  const cudaStream_t stream = cuda::compute_stream(ctx);
  const LossScalingUpdate f{cuda::scalar_ref(&flag),
                            scale.data<float>(),
                            good.data<int64_t>(),
                            bad.data<int64_t>(),
                            skipped.data<int64_t>(),
                            at_min.data<int64_t>(),
                            ctx.out("LossScaling", {1}, DType::f32).data<float>(),
                            ctx.out("OutGoodSteps", {1}, DType::i64).data<int64_t>(),
                            ctx.out("OutBadSteps", {1}, DType::i64).data<int64_t>(),
                            ctx.out("OutSkipped", {1}, DType::i64).data<int64_t>(),
                            ctx.out("OutConsecutiveSkipsAtMin", {1}, DType::i64).data<int64_t>(),
                            to_params(config)};
  cuda::launch_grid_stride(1, stream, f);
}

// ---- inject_overflow -------------------------------------------------------------------

void inject_overflow_cuda(OpContext& ctx) {
  const int64_t step = ctx.attr<int64_t>("step", 0);
  const int rank = ctx.attr<int>("rank", -1);
  const int my_rank = ctx.env.comm ? ctx.env.comm->rank() : 0;
  if (rank >= 0 && rank != my_rank) return;
  // A micro-batch of the step (--grad-accum-steps), when the attr names one.
  const int64_t micro_batch = ctx.attr<int64_t>("micro_batch", -1);
  if (micro_batch >= 0 && micro_batch != ctx.env.micro_batch) return;
  // With the step in device memory the kernel decides (a recorded step
  // replays for every step); otherwise the host does, and launches nothing.
  const int64_t* now = ctx.env.device_step;
  if (!now && ctx.env.step != step) return;
  const cudaStream_t stream = cuda::compute_stream(ctx);
  for (size_t i = 0; i < ctx.op.outs("Out").size(); ++i) {
    Tensor& g = ctx.out_existing("Out", i);
    if (g.numel() == 0) continue;
    cuda::check_on_device(ctx, g, "Out");
    cuda::dispatch_floating(g.dtype(), [&](auto tag) {
      using T = decltype(tag);
      cuda::launch_grid_stride(1, stream, WriteInfFirst<T>{g.data<T>(), now, step});
    });
  }
}

const bool registered =
    OpRegistry::instance().add_cuda_kernel("check_finite_and_unscale", check_finite_and_unscale_cuda) &&
    OpRegistry::instance().add_cuda_kernel("cast_check_finite_and_unscale", cast_check_finite_and_unscale_cuda) &&
    OpRegistry::instance().add_cuda_kernel("update_loss_scaling", update_loss_scaling_cuda) &&
    OpRegistry::instance().add_cuda_kernel("inject_overflow", inject_overflow_cuda);

}  // namespace
}  // namespace mix::amp
