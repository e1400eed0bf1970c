#pragma once
// elementwise_add's dtype rule and its gradient's view of Y, shared by the CPU
// kernels (runtime/ops/elementwise_add.cc) and their CUDA twins
// (runtime/ops/cuda/elementwise.cu).
#include <string>

#include "runtime/core/check.h"
#include "runtime/core/tensor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/broadcast.h"

namespace mix::add_rules {

/// X and Y share a floating dtype, or Y is FP16/BF16 beside an FP32 X and has
/// X's shape (`same_shape`): the residual add amp::fold_widening_casts makes.
inline void check_dtypes(DType x, DType y, bool same_shape) {
  if (x == y) return;
  MIX_CHECK(x == DType::f32 && (y == DType::f16 || y == DType::bf16),
            "elementwise_add: X is " << dtype_name(x) << " but Y is " << dtype_name(y)
                                     << " (the same dtype, or an f16/bf16 Y beside an f32 X; amp::rewrite inserts "
                                        "casts)");
  MIX_CHECK(same_shape, "elementwise_add: an " << dtype_name(y)
                                               << " Y beside an f32 X must have X's shape (a "
                                                  "broadcast Y takes X's dtype)");
}

/// Y as elementwise_add_grad knows it without reading it: the grad maker's
/// attrs y_shape (declared, the batch's -1 taken from Out@GRAD) and y_dtype.
struct AddGradY {
  Shape shape;
  DType dtype;
};
inline AddGradY grad_y(const OpContext& ctx, const Tensor& dout) {
  MIX_CHECK(ctx.op.has_attr("y_shape") && ctx.op.has_attr("y_dtype"),
            "elementwise_add_grad: attrs y_shape and y_dtype are missing (elementwise_add's grad maker sets them)");
  const int axis = ctx.attr<int>("axis", -1);
  return {resolve_batch_dims(dout.shape(), ctx.attr<std::vector<int64_t>>("y_shape", {}), axis, "elementwise_add_grad"),
          parse_dtype(ctx.attr<std::string>("y_dtype", ""))};
}

}  // namespace mix::add_rules
