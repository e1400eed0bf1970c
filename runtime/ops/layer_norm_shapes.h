#pragma once
// layer_norm's view of X and its parameter checks, shared by its CPU kernels
// (runtime/ops/layer_norm.cc) and its CUDA launchers
// (runtime/ops/cuda/layer_norm.cu), and by fused_add_layer_norm: X as [rows,
// cols] around begin_norm_axis.
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/core/check.h"
#include "runtime/core/tensor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"
#include "runtime/ops/widening.h"

namespace mix::layer_norm_rules {

struct NormDims {
  int64_t rows, cols;  // rows is -1 when a leading dim is unknown at build time
};

/// begin_norm_axis resolved against X's rank, in [0, ndim).
inline size_t begin_axis(const OpDesc& op, const Shape& x) {
  const int64_t ndim = static_cast<int64_t>(x.size());
  const int64_t attr = op.attr<int64_t>("begin_norm_axis", 1);
  const int64_t a = attr < 0 ? attr + ndim : attr;
  MIX_CHECK(a >= 0 && a < ndim, op.type << ": begin_norm_axis " << attr << " is out of range for X " << shape_str(x)
                                        << " (" << ndim << " dims: use 0.." << ndim - 1 << " or -" << ndim << "..-1)");
  return static_cast<size_t>(a);
}

inline NormDims norm_dims(const OpDesc& op, const Shape& x) {
  const size_t a = begin_axis(op, x);
  NormDims d{1, 1};
  for (size_t i = 0; i < x.size(); ++i) {
    if (i < a) {
      d.rows = (x[i] < 0 || d.rows < 0) ? -1 : d.rows * x[i];
    } else {
      MIX_CHECK(x[i] >= 0, op.type << ": the normalised dims of X " << shape_str(x) << " (from begin_norm_axis " << a
                                   << ") must be known when the program is built");
      d.cols *= x[i];
    }
  }
  MIX_CHECK(d.cols > 0,
            op.type << ": X " << shape_str(x) << " has no values to normalise per row (begin_norm_axis " << a << ")");
  return d;
}

/// Scale and Bias, where the op has them, as the program declares them: f32 [cols].
inline void check_params(const Program& p, const OpDesc& op, int64_t cols) {
  for (const char* slot : {"Scale", "Bias"}) {
    const std::string name = op.in_or_empty(slot);
    if (name.empty()) continue;
    const VarDesc& v = p.var(name);
    MIX_CHECK(v.dtype == DType::f32 && v.shape == Shape{cols}, op.type << ": " << slot << " " << name << " must be f32["
                                                                       << cols << "] (one per normalised value), got "
                                                                       << dtype_name(v.dtype) << shape_str(v.shape));
  }
}

/// Scale or Bias as an FP32 [cols] pointer (host or device memory, wherever
/// the tensor lives), or null when the slot is absent.
inline const float* param(const OpContext& ctx, const char* slot, int64_t cols) {
  const Tensor* t = ctx.in_opt(slot);
  if (!t) return nullptr;
  MIX_CHECK(t->dtype() == DType::f32 && t->numel() == cols, ctx.op.type << ": " << slot << " must be f32[" << cols
                                                                        << "], got " << dtype_name(t->dtype())
                                                                        << shape_str(t->shape()));
  return t->data<float>();
}

/// Y's dtype for an X of dtype `x`: attr out_dtype, which may name FP16 or
/// BF16 for an FP32 X (amp::fold_casts_into_producers: Y rounded once on
/// store, as the cast it replaces would round it), or X's own dtype.
inline DType y_dtype(const OpDesc& op, DType x) {
  if (!op.has_attr("out_dtype")) return x;
  const DType y = parse_dtype(op.attr<std::string>("out_dtype", ""));
  MIX_CHECK(widening::allowed(y, x), op.type << ": out_dtype " << dtype_name(y) << " with an " << dtype_name(x)
                                             << " X is not supported (X's dtype, or f16/bf16 for an f32 X)");
  return y;
}

/// layer_norm_grad's Y@GRAD must have X's shape, and X's dtype or Y's
/// narrower one (f16/bf16 beside an f32 X).
inline void check_grad_input(const Tensor& x, const Tensor& dy) {
  MIX_CHECK(dy.shape() == x.shape() && widening::allowed(dy.dtype(), x.dtype()),
            "layer_norm_grad: Y@GRAD " << dtype_name(dy.dtype()) << shape_str(dy.shape()) << " does not match X "
                                       << dtype_name(x.dtype()) << shape_str(x.shape())
                                       << " (X's shape; X's dtype, or f16/bf16 for an f32 X)");
}

/// layer_norm_grad's saved statistics: f32[rows] each.
inline void check_stats(const Tensor& mean, const Tensor& var, int64_t rows) {
  MIX_CHECK(mean.numel() == rows && var.numel() == rows && mean.dtype() == DType::f32 && var.dtype() == DType::f32,
            "layer_norm_grad: Mean and Variance must be f32[" << rows << "], got " << dtype_name(mean.dtype())
                                                              << shape_str(mean.shape()) << " and "
                                                              << dtype_name(var.dtype()) << shape_str(var.shape()));
}

}  // namespace mix::layer_norm_rules
