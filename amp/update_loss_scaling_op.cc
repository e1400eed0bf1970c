// update_loss_scaling (Paddle's op): one step of the dynamic loss scaler on
// the scaler's persistable state, fed the step's global found_inf flag.
//
//   inputs   FoundInfinite          i32 [1] or f32 [1] (or i64), nonzero: the step overflowed
//            PrevLossScaling        f32 [1]
//            InGoodSteps            i64 [1]
//            InBadSteps             i64 [1]
//            Skipped                i64 [1]   (total skipped steps)
//            ConsecutiveSkipsAtMin  i64 [1]
//   outputs  LossScaling, OutGoodSteps, OutBadSteps, OutSkipped, OutConsecutiveSkipsAtMin:
//            normally the very variables of the inputs (updated in place)
//   attrs    those of amp::to_op_attrs: mode "dynamic"|"static"|"none", incr_every_n_steps,
//            decr_every_n_nan_or_inf, incr_ratio, decr_ratio, min_loss_scaling,
//            on_min_scale "error"|"continue", max_skips_at_min
//
// The kernel runs amp::update_loss_scaling, the scaler's own update, so the
// trainer's op and the host LossScaler cannot drift apart; it throws the
// scaler's "stuck at the minimum" error when on_min_scale is "error". (The
// CUDA kernel leaves that error to amp::check_loss_scale_not_stuck, which the
// trainer calls after every step.)
#include <cstdint>

#include "amp/loss_scaler.h"
#include "runtime/core/check.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/op_registry.h"

namespace mix {
namespace {

struct Slot {
  const char* in;
  const char* out;
  DType dtype;
};
constexpr Slot kScale{"PrevLossScaling", "LossScaling", DType::f32};
constexpr Slot kGood{"InGoodSteps", "OutGoodSteps", DType::i64};
constexpr Slot kBad{"InBadSteps", "OutBadSteps", DType::i64};
constexpr Slot kSkipped{"Skipped", "OutSkipped", DType::i64};
constexpr Slot kAtMin{"ConsecutiveSkipsAtMin", "OutConsecutiveSkipsAtMin", DType::i64};
constexpr Slot kState[] = {kScale, kGood, kBad, kSkipped, kAtMin};

void infer_update_loss_scaling(Program& p, OpDesc& op) {
  const VarDesc& flag = p.var(op.in("FoundInfinite"));
  MIX_CHECK(flag.dtype == DType::i32 || flag.dtype == DType::i64 || flag.dtype == DType::f32,
            "update_loss_scaling: FoundInfinite '" << flag.name << "' must be i32, i64 or f32, not "
                                                   << dtype_name(flag.dtype));
  for (const Slot& s : kState) {
    const VarDesc& in = p.var(op.in(s.in));
    MIX_CHECK(in.dtype == s.dtype, "update_loss_scaling: " << s.in << " '" << in.name << "' must be "
                                                           << dtype_name(s.dtype) << ", not " << dtype_name(in.dtype));
    declare_var(p, op.out(s.out), {1}, s.dtype);
  }
  // Validates the attributes once, when the op is built, not at the first step.
  amp::from_op_attrs(op);
}

const Tensor& scalar_input(OpContext& ctx, const char* slot) {
  const Tensor& t = ctx.in(slot);
  MIX_CHECK(t.numel() == 1, "update_loss_scaling: " << slot << " '" << ctx.op.in(slot) << "' must hold one value, has "
                                                   << shape_str(t.shape()));
  return t;
}

int64_t read_i64(OpContext& ctx, const Slot& s) {
  const Tensor& t = scalar_input(ctx, s.in);
  MIX_CHECK(t.dtype() == DType::i64, "update_loss_scaling: " << s.in << " must be i64, not " << dtype_name(t.dtype()));
  return t.data<int64_t>()[0];
}

bool read_found_inf(OpContext& ctx) {
  const Tensor& t = scalar_input(ctx, "FoundInfinite");
  switch (t.dtype()) {
    case DType::i32: return t.data<int32_t>()[0] != 0;
    case DType::i64: return t.data<int64_t>()[0] != 0;
    case DType::f32: return t.data<float>()[0] != 0.f;  // NaN != 0: an overflow too
    default: MIX_FAIL("update_loss_scaling: FoundInfinite must be i32, i64 or f32, not " << dtype_name(t.dtype()));
  }
}

void update_loss_scaling_cpu(OpContext& ctx) {
  const amp::LossScalerConfig config = amp::from_op_attrs(ctx.op);
  const bool found_inf = read_found_inf(ctx);

  // Read everything before writing anything: outputs alias inputs.
  const Tensor& prev = scalar_input(ctx, kScale.in);
  MIX_CHECK(prev.dtype() == DType::f32,
            "update_loss_scaling: PrevLossScaling must be f32, not " << dtype_name(prev.dtype()));
  amp::LossScalerState s;
  s.scale = prev.data<float>()[0];
  s.good_steps = read_i64(ctx, kGood);
  s.bad_steps = read_i64(ctx, kBad);
  s.skipped_steps = read_i64(ctx, kSkipped);
  s.consecutive_skips_at_min = read_i64(ctx, kAtMin);

  // The state is written back before a "stuck" error propagates, so what is
  // left in the scope (and in a checkpoint) matches the host scaler's.
  auto write_back = [&] {
    ctx.out(kScale.out, {1}, DType::f32).data<float>()[0] = s.scale;
    ctx.out(kGood.out, {1}, DType::i64).data<int64_t>()[0] = s.good_steps;
    ctx.out(kBad.out, {1}, DType::i64).data<int64_t>()[0] = s.bad_steps;
    ctx.out(kSkipped.out, {1}, DType::i64).data<int64_t>()[0] = s.skipped_steps;
    ctx.out(kAtMin.out, {1}, DType::i64).data<int64_t>()[0] = s.consecutive_skips_at_min;
  };
  try {
    amp::update_loss_scaling(config, s, found_inf);
  } catch (const Error&) {
    write_back();
    throw;
  }
  write_back();
}

MIX_REGISTER_OP("update_loss_scaling", OpInfo{infer_update_loss_scaling, update_loss_scaling_cpu, {}, {}});

// One state variable, wherever it lives.
Tensor on_host(const Scope& scope, const OpDesc& op, const Slot& s) {
  const Tensor t = scope.get(op.out(s.out)).to(cpu_device());
  MIX_CHECK(t.numel() == 1 && t.dtype() == s.dtype,
            "update_loss_scaling: " << s.out << " '" << op.out(s.out) << "' must be one " << dtype_name(s.dtype));
  return t;
}

}  // namespace

void amp::check_loss_scale_not_stuck(const Program& program, const Scope& scope) {
  for (size_t index = 0; index < program.ops().size(); ++index) {
    const OpDesc& op = program.ops()[index];
    if (op.type != "update_loss_scaling") continue;
    const LossScalerConfig config = from_op_attrs(op);
    const LossScalingParams params = to_params(config);
    if (config.on_min_scale != LossScalerConfig::OnMinScale::error || params.max_skips_at_min <= 0) continue;
    LossScalerState s;
    s.consecutive_skips_at_min = on_host(scope, op, kAtMin).data<int64_t>()[0];
    if (!stuck_at_min(params, s)) continue;
    s.scale = on_host(scope, op, kScale).data<float>()[0];
    s.good_steps = on_host(scope, op, kGood).data<int64_t>()[0];
    s.bad_steps = on_host(scope, op, kBad).data<int64_t>()[0];
    s.skipped_steps = on_host(scope, op, kSkipped).data<int64_t>()[0];
    try {
      check_not_stuck(config, s);
    } catch (const Error& e) {  // the words the CPU kernel's error has, raised through the executor
      throw Error(with_op_context(e.what(), index, op.type));
    }
  }
}

}  // namespace mix
