#pragma once
// Shape and attribute rules of softmax_with_cross_entropy, shared by its CPU
// and CUDA kernels (the host-side checks both make before computing), and
// where its grad reads the softmax from.
#include <cstdint>

#include "runtime/core/check.h"
#include "runtime/core/tensor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"
#include "runtime/ops/widening.h"

namespace mix::xent {

inline constexpr const char* kOp = "softmax_with_cross_entropy";

/// Checks Label's shape against Logits' ([..., 1] or [...]); -1 (batch) matches anything.
inline void check_label_shape(const Shape& logits, const Shape& label) {
  const Shape lead(logits.begin(), logits.end() - 1);
  Shape with_one = lead;
  with_one.push_back(1);
  auto matches = [](const Shape& a, const Shape& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] >= 0 && b[i] >= 0 && a[i] != b[i]) return false;
    return true;
  };
  MIX_CHECK(matches(label, with_one) || matches(label, lead),
            kOp << ": Label " << shape_str(label) << " does not match Logits " << shape_str(logits) << " (expected "
                << shape_str(with_one) << " or " << shape_str(lead) << ")");
}

inline void check_attrs(const OpDesc& op, size_t logits_ndim) {
  MIX_CHECK(!op.attr<bool>("soft_label", false), kOp << ": soft_label=true is not supported (hard labels only)");
  const int64_t axis = op.attr<int64_t>("axis", -1);
  const int64_t last = static_cast<int64_t>(logits_ndim) - 1;
  MIX_CHECK(axis == -1 || axis == last,
            kOp << ": only the last axis is supported (axis -1 or " << last << "), got axis " << axis);
}

struct Dims {
  int64_t rows, classes;
  /// Classes that take part: attr valid_classes (default all). The columns
  /// from here to `classes` are padding (a vocabulary padded for the GEMMs):
  /// they take no probability (softmax 0), get gradient 0, and a label there
  /// is out of range, so the loss and gradients equal those of logits without
  /// the padding columns.
  int64_t valid = 0;
};

/// Attr valid_classes of `op` for rows of `classes` logits, checked: 1 to classes (0 or absent: all).
inline int64_t valid_classes(const OpDesc& op, int64_t classes) {
  const int64_t valid = op.attr<int64_t>("valid_classes", 0);
  MIX_CHECK(valid >= 0 && valid <= classes, kOp << ": attr valid_classes " << valid << " is outside [1, " << classes
                                                << "] (the logits' classes; 0: all)");
  return valid == 0 ? classes : valid;
}

inline Dims dims_of(const OpDesc& op, const Tensor& logits, const Tensor& label) {
  MIX_CHECK(logits.ndim() >= 1, kOp << ": Logits must have at least one dim");
  MIX_CHECK(label.dtype() == DType::i64 || label.dtype() == DType::i32,
            kOp << ": Label is " << dtype_name(label.dtype()) << ", expected i64 class indices");
  check_label_shape(logits.shape(), label.shape());
  const int64_t c = logits.dim(-1);
  const int64_t rows = c == 0 ? 0 : logits.numel() / c;
  MIX_CHECK(label.numel() == rows, kOp << ": Label holds " << label.numel() << " values for " << rows << " rows");
  return {rows, c, valid_classes(op, c)};
}

/// Logits' leading dims (one entry per row) followed by `per_row`.
inline Shape per_row_shape(const Shape& logits, int64_t per_row) {
  Shape s(logits.begin(), logits.end() - 1);
  s.push_back(per_row);
  return s;
}

/// Loss [..., 1]: one value per row.
inline Shape loss_shape_of(const Shape& logits) { return per_row_shape(logits, 1); }

/// RowStats [..., 2]: each row's max and sum(exp(x - max)), FP32.
inline Shape row_stats_shape(const Shape& logits) { return per_row_shape(logits, 2); }

/// Where softmax_with_cross_entropy_grad takes the softmax from: the stored
/// Softmax, or Logits and RowStats (runtime/passes/recompute_softmax.h).
struct GradSource {
  Tensor values;     // Softmax, or Logits when recomputing
  Tensor row_stats;  // RowStats; empty when Softmax is stored
  bool recompute = false;
  DType softmax_dtype = DType::f32;  // the dtype the forward stored (or would have stored) the softmax in
  DType dx_dtype = DType::f32;       // Logits@GRAD's (attr x_grad_dtype, runtime/ops/widening.h)
};

inline GradSource grad_source(const OpContext& ctx) {
  GradSource g;
  g.recompute = !ctx.op.in_or_empty("RowStats").empty();
  if (!g.recompute) {
    g.values = ctx.in("Softmax");
    g.softmax_dtype = g.values.dtype();
    g.dx_dtype = widening::x_grad_dtype(ctx.op, g.softmax_dtype);
    return g;
  }
  MIX_CHECK(ctx.op.has_attr("softmax_dtype"),
            kOp << "_grad: recomputing the softmax needs attr softmax_dtype (the dtype the forward would store it in)");
  g.values = ctx.in("Logits");
  g.row_stats = ctx.in("RowStats");
  g.softmax_dtype = parse_dtype(ctx.op.attr<std::string>("softmax_dtype", ""));
  g.dx_dtype = widening::x_grad_dtype(ctx.op, g.softmax_dtype);
  MIX_CHECK(g.values.dtype() == g.dx_dtype,
            kOp << "_grad: Logits is " << dtype_name(g.values.dtype()) << ", its gradient " << dtype_name(g.dx_dtype));
  MIX_CHECK(g.values.ndim() >= 1, kOp << "_grad: Logits must have at least one dim");
  const int64_t rows = shape_numel(loss_shape_of(g.values.shape()));
  MIX_CHECK(g.row_stats.dtype() == DType::f32 && g.row_stats.numel() == 2 * rows,
            kOp << "_grad: RowStats " << dtype_name(g.row_stats.dtype()) << shape_str(g.row_stats.shape())
                << " does not hold an f32 max and sum for each of the " << rows << " rows");
  return g;
}

}  // namespace mix::xent
