#pragma once
// Input Accumulate of the gradient ops that add a gradient's other part to
// the part they write: layer_norm_grad's X@GRAD and lookup_table_grad's
// W@GRAD. runtime/passes/fold_grad_sums.h gives it to them in place of the
// `sum` that autodiff put after them; fn::add_grad_part adds the two.
// Shared by those ops' CPU kernels and CUDA launchers.
#include <string>

#include "runtime/core/check.h"
#include "runtime/core/tensor.h"
#include "runtime/ir/op_context.h"
#include "runtime/ops/widening.h"

namespace mix::grad_part {

/// The op's Accumulate, or null when it has none, checked against the output
/// `out_slot` it is added to (shape `shape`, dtype `dtype`): the same shape,
/// and the same dtype or, with `narrower_ok`, FP16/BF16 beside an FP32 output
/// (widened on load, exact, as the cast it replaces widened it).
inline const Tensor* accumulate(const OpContext& ctx, const std::string& out_slot, const Shape& shape, DType dtype,
                                bool narrower_ok) {
  const Tensor* acc = ctx.in_opt("Accumulate");
  if (!acc) return nullptr;
  const bool dtype_ok = narrower_ok ? widening::allowed(acc->dtype(), dtype) : acc->dtype() == dtype;
  MIX_CHECK(acc->shape() == shape && dtype_ok,
            ctx.op.type << ": Accumulate " << dtype_name(acc->dtype()) << shape_str(acc->shape()) << " must be "
                        << dtype_name(dtype) << shape_str(shape) << (narrower_ok ? " (or f16/bf16 for f32)" : "")
                        << ", the other part of " << out_slot << " that the op adds to its own");
  return acc;
}

}  // namespace mix::grad_part
