#pragma once
// Shared plumbing of the optimizer update ops (sgd, momentum, adamw).
#include "runtime/check.h"
#include "runtime/op_registry.h"

namespace mix::optim {

/// True when the op's SkipUpdate flag (global found_inf) says this step overflowed.
inline bool skip_this_step(const OpContext& ctx) {
  const Tensor* skip = ctx.in_opt("SkipUpdate");
  return skip && skip->item_float(0) != 0.f;
}

/// The FP32 master parameter (updated in place) and its FP32 gradient.
inline std::pair<Tensor*, const Tensor*> param_and_grad(OpContext& ctx) {
  Tensor& param = ctx.out_existing("ParamOut");
  const Tensor& grad = ctx.in("Grad");
  MIX_CHECK(param.dtype() == DType::f32 && grad.dtype() == DType::f32,
            "optimizer " << ctx.op.type << " updates FP32 masters with FP32 gradients; got parameter "
                         << dtype_name(param.dtype()) << ", gradient " << dtype_name(grad.dtype()) << " for "
                         << ctx.op.in("Param"));
  MIX_CHECK(param.numel() == grad.numel(), "gradient " << ctx.op.in("Grad") << " " << shape_str(grad.shape())
                                                       << " does not match parameter " << shape_str(param.shape()));
  return {&param, &grad};
}

inline float learning_rate(const OpContext& ctx) { return ctx.in("LearningRate").data<float>()[0]; }

/// Inputs every update op has; `skip` may be empty.
inline std::map<std::string, std::vector<std::string>> update_inputs(const std::string& param, const std::string& grad,
                                                                      const std::string& lr, const std::string& skip) {
  std::map<std::string, std::vector<std::string>> in{{"Param", {param}}, {"Grad", {grad}}, {"LearningRate", {lr}}};
  if (!skip.empty()) in["SkipUpdate"] = {skip};
  return in;
}

}  // namespace mix::optim
