#pragma once
// Shared plumbing of the optimizer update ops (sgd, momentum, adamw).
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"

namespace mix::optim {

/// True when the op's SkipUpdate flag (global found_inf) says this step overflowed.
inline bool skip_this_step(const OpContext& ctx) {
  const Tensor* skip = ctx.in_opt("SkipUpdate");
  return skip && skip->item_float(0) != 0.f;
}

/// How many parameters the op updates. One update op updates a group of
/// parameters (all those of one weight decay, as Paddle's merged_momentum does),
/// so that a GPU updates them in a few multi-tensor launches: Param, Grad,
/// ParamOut and each of `state_slots` (outputs, e.g. VelocityOut) list them in
/// the same order.
inline size_t updated_count(const OpContext& ctx, const std::vector<const char*>& state_slots = {}) {
  const size_t n = ctx.op.ins("Param").size();
  MIX_CHECK(ctx.op.ins("Grad").size() == n && ctx.op.outs("ParamOut").size() == n,
            ctx.op.type << ": " << n << " Param, " << ctx.op.ins("Grad").size() << " Grad and "
                        << ctx.op.outs("ParamOut").size() << " ParamOut: one of each per parameter");
  for (const char* slot : state_slots)
    MIX_CHECK(ctx.op.outs(slot).size() == n,
              ctx.op.type << ": " << ctx.op.outs(slot).size() << " " << slot << " for " << n << " parameters");
  return n;
}

/// Parameter k's FP32 master (updated in place) and its FP32 gradient.
inline std::pair<Tensor*, const Tensor*> param_and_grad(OpContext& ctx, size_t k = 0) {
  Tensor& param = ctx.out_existing("ParamOut", k);
  const Tensor& grad = ctx.scope.get(ctx.op.ins("Grad").at(k));
  MIX_CHECK(param.dtype() == DType::f32 && grad.dtype() == DType::f32,
            "optimizer " << ctx.op.type << " updates FP32 masters with FP32 gradients; got parameter "
                         << dtype_name(param.dtype()) << ", gradient " << dtype_name(grad.dtype()) << " for "
                         << ctx.op.ins("Param").at(k));
  MIX_CHECK(param.numel() == grad.numel(), "gradient " << ctx.op.ins("Grad").at(k) << " " << shape_str(grad.shape())
                                                       << " does not match parameter " << shape_str(param.shape()));
  return {&param, &grad};
}

/// Parameter k's optimizer state in output `slot` (updated in place), checked against the parameter.
inline Tensor& state_of(OpContext& ctx, const char* slot, size_t k, const Tensor& param) {
  Tensor& t = ctx.out_existing(slot, k);
  MIX_CHECK(t.dtype() == DType::f32 && t.numel() == param.numel(),
            ctx.op.type << ": " << slot << " " << ctx.op.outs(slot).at(k) << " " << dtype_name(t.dtype())
                        << shape_str(t.shape()) << " does not match the FP32 parameter " << shape_str(param.shape()));
  return t;
}

inline float learning_rate(const OpContext& ctx) { return ctx.in("LearningRate").data<float>()[0]; }

/// Inputs every update op has; `skip` may be empty.
inline std::map<std::string, std::vector<std::string>> update_inputs(const std::vector<std::string>& params,
                                                                     const std::vector<std::string>& grads,
                                                                     const std::string& lr, const std::string& skip) {
  std::map<std::string, std::vector<std::string>> in{{"Param", params}, {"Grad", grads}, {"LearningRate", {lr}}};
  if (!skip.empty()) in["SkipUpdate"] = {skip};
  return in;
}

}  // namespace mix::optim
