// check_finite_and_unscale (Paddle's op) and its fused twin
// cast_check_finite_and_unscale: the unscale of the AMP step (amp/unscale_pass.h).
//
// check_finite_and_unscale
//   inputs   X              gradients, any floating dtype (FP32 master gradients in our step)
//            Scale          f32 [1], the loss scale
//            FoundInfiniteIn  optional i32 [1]: a flag to OR into the result, so that
//                           several of these ops can share one found_inf
//   outputs  Out            one per X, of X's shape and dtype; normally X itself (in place)
//            FoundInfinite  i32 [1]: 1 when any element of any X is inf or NaN, else 0
//            FoundInfiniteEach  optional i32 [len(X)]: element i is 1 when X[i]
//                           held an inf or NaN (overflow provenance: which
//                           parameters' gradients overflowed)
//   Out = X * (1 / Scale), rounded to X's dtype on store.
//
// cast_check_finite_and_unscale: the same with Out in FP32 whatever X's dtype:
//   Out = float(X) * (1 / Scale). After the FP16 gradient all-reduce this does
//   the cast to FP32 and the unscale in one pass over the FP16 gradient. Out
//   must name new variables for non-FP32 X (an FP16 variable cannot become FP32
//   in place).
//
// The flag is raised from the inputs, as Paddle's kernel and fn::UnscaleCheck
// do: Out is computed for every element either way (the optimizer skips an
// overflowed step, so nobody reads it then).
#include <cstdint>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"

namespace mix {
namespace {

// out[i] = f(x[i]) for storage types In and Out; returns whether any x[i] was non-finite.
template <typename In, typename Out>
bool unscale_check(const In* x, Out* out, int64_t n, fn::UnscaleCheck f) {
  bool found = false;
  for (int64_t i = 0; i < n; ++i) out[i] = from_float<Out>(f(to_float(x[i]), found));
  return found;
}

void infer_common(Program& p, OpDesc& op, bool to_f32) {
  const auto& xs = op.ins("X");
  const auto& outs = op.outs("Out");
  MIX_CHECK(xs.size() == outs.size(),
            op.type << ": X holds " << xs.size() << " variables but Out holds " << outs.size());
  const VarDesc& scale = p.var(op.in("Scale"));
  MIX_CHECK(scale.dtype == DType::f32, op.type << ": Scale '" << scale.name << "' must be f32, not "
                                               << dtype_name(scale.dtype));
  for (size_t i = 0; i < xs.size(); ++i) {
    const VarDesc& x = p.var(xs[i]);
    MIX_CHECK(is_floating(x.dtype), op.type << ": X '" << x.name << "' must be floating, not " << dtype_name(x.dtype));
    const DType out_dtype = to_f32 ? DType::f32 : x.dtype;
    MIX_CHECK(outs[i] != xs[i] || out_dtype == x.dtype,
              op.type << ": Out '" << outs[i] << "' must be a new variable: X '" << x.name << "' is "
                      << dtype_name(x.dtype) << " and Out is f32");
    const Shape shape = x.shape;  // copy: declare_var may grow the variable list
    declare_var(p, outs[i], shape, out_dtype);
  }
  declare_var(p, op.out("FoundInfinite"), {1}, DType::i32);
  if (!op.out_or_empty("FoundInfiniteEach").empty())
    declare_var(p, op.out("FoundInfiniteEach"), {static_cast<int64_t>(xs.size())}, DType::i32);
}

void infer_check_finite_and_unscale(Program& p, OpDesc& op) { infer_common(p, op, false); }
void infer_cast_check_finite_and_unscale(Program& p, OpDesc& op) { infer_common(p, op, true); }

void run_common(OpContext& ctx, bool to_f32) {
  const Tensor& scale_t = ctx.in("Scale");
  MIX_CHECK(scale_t.dtype() == DType::f32 && scale_t.numel() == 1,
            ctx.op.type << ": Scale must be f32 [1], got " << dtype_name(scale_t.dtype()) << shape_str(scale_t.shape()));
  const float scale = scale_t.data<float>()[0];
  // The scaler keeps the scale >= min_loss_scaling > 0; anything else is a bug
  // upstream, and would turn every gradient into inf/NaN silently.
  MIX_CHECK(fn::valid_loss_scale(scale), ctx.op.type << ": the loss scale must be positive and finite, got " << scale);
  const fn::UnscaleCheck f = fn::unscale_check_for(scale);

  bool found = false;
  if (const Tensor* prev = ctx.in_opt("FoundInfiniteIn")) {
    MIX_CHECK(prev->dtype() == DType::i32 && prev->numel() == 1, ctx.op.type << ": FoundInfiniteIn must be i32 [1]");
    found = prev->data<int32_t>()[0] != 0;
  }

  const auto& x_names = ctx.op.ins("X");
  const auto& out_names = ctx.op.outs("Out");
  MIX_CHECK(x_names.size() == out_names.size(),
            ctx.op.type << ": X holds " << x_names.size() << " variables but Out holds " << out_names.size());
  int32_t* each = ctx.wants("FoundInfiniteEach")
                      ? ctx.out("FoundInfiniteEach", {static_cast<int64_t>(x_names.size())}, DType::i32).data<int32_t>()
                      : nullptr;
  for (size_t i = 0; i < x_names.size(); ++i) {
    // By value: shares the storage, and stays valid if Out replaces the scope entry.
    const Tensor x = ctx.scope.get(x_names[i]);
    const DType out_dtype = to_f32 ? DType::f32 : x.dtype();
    MIX_CHECK(out_names[i] != x_names[i] || out_dtype == x.dtype(),
              ctx.op.type << ": Out '" << out_names[i] << "' must be a new variable for " << dtype_name(x.dtype())
                          << " X");
    Tensor& out = ctx.out("Out", x.shape(), out_dtype, i);
    cpu::dispatch_floating(x.dtype(), [&](auto in_tag) {
      using In = decltype(in_tag);
      cpu::dispatch_floating(out_dtype, [&](auto out_tag) {
        using Out = decltype(out_tag);
        const bool this_one = unscale_check(x.data<In>(), out.data<Out>(), x.numel(), f);
        if (each) each[i] = this_one ? 1 : 0;
        if (this_one) found = true;
      });
    });
  }
  ctx.out("FoundInfinite", {1}, DType::i32).data<int32_t>()[0] = found ? 1 : 0;
}

void check_finite_and_unscale_cpu(OpContext& ctx) { run_common(ctx, false); }
void cast_check_finite_and_unscale_cpu(OpContext& ctx) { run_common(ctx, true); }

MIX_REGISTER_OP("check_finite_and_unscale",
                OpInfo{infer_check_finite_and_unscale, check_finite_and_unscale_cpu, {}, {}});
MIX_REGISTER_OP("cast_check_finite_and_unscale",
                OpInfo{infer_cast_check_finite_and_unscale, cast_check_finite_and_unscale_cpu, {}, {}});

}  // namespace
}  // namespace mix
