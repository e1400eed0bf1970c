#pragma once
// fused_add_layer_norm's view of its residual operand, shared by its CPU
// kernel (runtime/ops/fused_add_layer_norm.cc) and its CUDA launcher
// (runtime/ops/cuda/fused_add_layer_norm.cu).
#include <algorithm>
#include <string>

#include "runtime/core/check.h"
#include "runtime/core/tensor.h"
#include "runtime/ops/elementwise_add_shapes.h"

namespace mix::add_layer_norm_rules {

/// Whether Y has X's shape or X's trailing dims (added to every leading
/// index, as the position embedding is added to each sequence of a batch).
inline bool y_is_trailing(const Shape& x, const Shape& y) {
  return y.size() <= x.size() && std::equal(y.begin(), y.end(), x.end() - static_cast<std::ptrdiff_t>(y.size()));
}

/// X and Y as elementwise_add takes them here: Y of X's shape (X's dtype, or
/// FP16/BF16 beside an FP32 X), or of X's trailing dims in X's dtype.
inline void check_operands(const std::string& op, const Shape& x, DType x_dtype, const Shape& y, DType y_dtype) {
  MIX_CHECK(y_is_trailing(x, y),
            op << ": Y " << shape_str(y) << " must have X's shape " << shape_str(x) << " or its trailing dims");
  add_rules::check_dtypes(x_dtype, y_dtype, x == y);
}

}  // namespace mix::add_layer_norm_rules
