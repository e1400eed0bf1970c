// softmax_with_cross_entropy (hard labels): Logits [..., C] of any float dtype,
// Label i64 (or i32) [..., 1] or [...]; outputs Softmax [..., C] and Loss
// [..., 1], both in Logits' dtype or, with attr out_dtype "f32", in FP32 (see
// below; under AMP the op is on the black list and runs in FP32). Per row, in FP32:
//   loss = log(sum exp(x - max)) + max - x[label]   (runtime/kernels/softmax_row.h)
// Rows whose label equals attr ignore_index (default -100, as in PyTorch) get
// loss 0 and gradient 0. Any other label outside [0, C) is an error naming the
// row, the value and C.
//
// Attr valid_classes V (default C): only the first V columns are classes; the
// other C - V are padding (a vocabulary padded to a multiple of 64 for the
// GEMMs, models/transformer.cc). The row's max and sum run over the V columns
// alone, the padding's Softmax is 0 and its gradient 0, and a label must be
// below V: the loss and the first V gradients are those of the unpadded
// logits, bit for bit, whatever values the padding columns hold.
// Grad (softmax_with_cross_entropy_grad): Logits@GRAD = (Softmax - onehot) *
// Loss@GRAD[row], from the saved Softmax. A gradient arriving at the Softmax
// output is ignored, as in Paddle: Softmax is a by-product for the grad and
// for metrics, not a differentiable output.
//
// Without a stored Softmax (runtime/passes/recompute_softmax.h): the forward op may
// have no Softmax output and write RowStats instead, f32 [rows, 2], each row's
// max and sum(exp(x - max)); the grad op then reads Logits and RowStats in
// place of Softmax and recomputes each softmax value as the forward would have
// stored it (in attr softmax_dtype): the same bits.
//
// Attr out_dtype "f32" (amp::fold_widening_casts, runtime/ops/widening.h): FP16
// or BF16 Logits give FP32 Softmax and Loss, the values the op computes on
// cast(Logits, f32); the grad then writes Logits@GRAD in Logits' dtype (attr
// x_grad_dtype).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/softmax_row.h"
#include "runtime/ops/cross_entropy_shapes.h"
#include "runtime/ops/widening.h"

namespace mix {
namespace {

using xent::check_attrs;
using xent::check_label_shape;
using xent::Dims;
using xent::dims_of;
using xent::kOp;
using xent::loss_shape_of;
using xent::row_stats_shape;

void infer_swce(Program& p, OpDesc& op) {
  const VarDesc& logits = p.var(op.in("Logits"));
  const VarDesc& label = p.var(op.in("Label"));
  MIX_CHECK(logits.shape.size() >= 1, kOp << ": Logits must have at least one dim");
  MIX_CHECK(is_floating(logits.dtype), kOp << ": Logits " << logits.name << " is " << dtype_name(logits.dtype)
                                            << ", expected a float dtype");
  MIX_CHECK(label.dtype == DType::i64 || label.dtype == DType::i32,
            kOp << ": Label " << label.name << " is " << dtype_name(label.dtype) << ", expected i64 class indices");
  check_attrs(op, logits.shape.size());
  check_label_shape(logits.shape, label.shape);
  if (logits.shape.back() >= 0) xent::valid_classes(op, logits.shape.back());
  const DType out = widening::out_dtype(op, logits.dtype);
  if (!op.out_or_empty("Softmax").empty()) declare_var(p, op.out("Softmax"), logits.shape, out);
  if (!op.out_or_empty("RowStats").empty())
    declare_var(p, op.out("RowStats"), row_stats_shape(logits.shape), DType::f32);
  declare_var(p, op.out("Loss"), loss_shape_of(logits.shape), out);
}

int64_t label_at(const Tensor& label, int64_t i) {
  return label.dtype() == DType::i64 ? label.data<int64_t>()[i] : label.data<int32_t>()[i];
}

// The row's label, or -1 for an ignored row; throws for a label outside [0, C).
int64_t checked_label(const Tensor& label, int64_t row, int64_t classes, int64_t ignore_index) {
  const int64_t l = label_at(label, row);
  if (l == ignore_index) return -1;
  MIX_CHECK(l >= 0 && l < classes, kOp << ": label " << l << " at row " << row << " is out of range for " << classes
                                        << " classes (expected 0 <= label < " << classes << ", or ignore_index "
                                        << ignore_index << ")");
  return l;
}




void swce_cpu(OpContext& ctx) {
  const Tensor& logits = ctx.in("Logits");
  const Tensor& label = ctx.in("Label");
  check_attrs(ctx.op, logits.shape().size());
  const Dims d = dims_of(ctx.op, logits, label);
  const int64_t ignore = ctx.attr<int64_t>("ignore_index", -100);
  // Validate every label before writing anything, so an error leaves no half-written outputs.
  for (int64_t i = 0; i < d.rows; ++i) checked_label(label, i, d.valid, ignore);
  const DType out = widening::out_dtype(ctx.op, logits.dtype());
  Tensor* softmax = ctx.wants("Softmax") ? &ctx.out("Softmax", logits.shape(), out) : nullptr;
  float* stats =
      ctx.wants("RowStats") ? ctx.out("RowStats", row_stats_shape(logits.shape()), DType::f32).data<float>() : nullptr;
  Tensor& loss = ctx.out("Loss", loss_shape_of(logits.shape()), out);
  widening::dispatch(logits.dtype(), out, [&](auto x_tag, auto y_tag) {
    using X = decltype(x_tag);
    using Y = decltype(y_tag);
    const X* x = logits.data<X>();
    Y* y = softmax ? softmax->data<Y>() : nullptr;
    Y* l = loss.data<Y>();
    std::vector<float> xbuf, ybuf;  // a row as floats, for FP16/BF16 storage (cpu::widened_row)
    for (int64_t i = 0; i < d.rows; ++i) {
      const int64_t lab = checked_label(label, i, d.valid, ignore);
      const float* xr = cpu::widened_row(x + i * d.classes, d.classes, xbuf);
      const fn::RowStats st = fn::row_stats(xr, d.valid);
      l[i] = from_float<Y>(lab < 0 ? 0.f : fn::cross_entropy_loss(st.sum, st.max, xr[lab]));
      if (stats) {
        stats[2 * i] = st.max;
        stats[2 * i + 1] = st.sum;
      }
      if (!y) continue;
      float* yr = cpu::float_row_for(y + i * d.classes, d.classes, ybuf);
      const fn::SoftmaxNormalize f = fn::softmax_normalizer(st.max, st.sum);
      for (int64_t k = 0; k < d.valid; ++k) yr[k] = f(xr[k]);
      std::fill(yr + d.valid, yr + d.classes, 0.f);  // padding takes no probability
      cpu::narrowed_row(yr, y + i * d.classes, d.classes);
    }
  });
}

void swce_grad_cpu(OpContext& ctx) {
  const xent::GradSource src = xent::grad_source(ctx);
  const Tensor& label = ctx.in("Label");
  const Tensor& dloss = ctx.in("Loss@GRAD");
  const Dims d = dims_of(ctx.op, src.values, label);
  MIX_CHECK(dloss.numel() == d.rows, kOp << "_grad: Loss@GRAD " << shape_str(dloss.shape()) << " does not hold one value per row ("
                                         << d.rows << " rows)");
  const int64_t ignore = ctx.attr<int64_t>("ignore_index", -100);
  Tensor& dx = ctx.out("Logits@GRAD", src.values.shape(), src.dx_dtype);
  widening::dispatch(dx.dtype(), src.softmax_dtype, [&](auto dx_tag, auto y_tag) {
    using DX = decltype(dx_tag);
    using Y = decltype(y_tag);
    DX* g = dx.data<DX>();
    std::vector<float> vbuf, ybuf, gbuf;
    for (int64_t i = 0; i < d.rows; ++i) {
      const int64_t lab = checked_label(label, i, d.valid, ignore);
      float* gr = cpu::float_row_for(g + i * d.classes, d.classes, gbuf);
      if (lab < 0) {
        std::fill(gr, gr + d.classes, 0.f);
      } else {
        const float* yr;
        if (src.recompute) {  // the softmax the forward did not store, from Logits (dtype DX) and the row's stats
          const float* xr = cpu::widened_row(src.values.data<DX>() + i * d.classes, d.classes, vbuf);
          const float* st = src.row_stats.data<float>() + 2 * i;
          const fn::SoftmaxNormalize f = fn::softmax_normalizer(st[0], st[1]);
          ybuf.resize(static_cast<size_t>(d.valid));
          for (int64_t k = 0; k < d.valid; ++k) ybuf[static_cast<size_t>(k)] = fn::softmax_as_stored<Y>(f, xr[k]);
          yr = ybuf.data();
        } else {
          yr = cpu::widened_row(src.values.data<Y>() + i * d.classes, d.classes, vbuf);
        }
        fn::softmax_cross_entropy_grad_row(yr, gr, d.valid, lab, dloss.item_float(i));
        std::fill(gr + d.valid, gr + d.classes, 0.f);  // the padding's logits do not reach the loss
      }
      cpu::narrowed_row(gr, g + i * d.classes, d.classes);
    }
  });
}

std::vector<OpDesc> swce_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dloss = g.grad_of_output(fwd.out("Loss"));
  if (dloss.empty()) return {};  // only Softmax carries a gradient: ignored (see the header)
  const std::string dx = g.grad_for_input(fwd.in("Logits"));
  if (dx.empty()) return {};
  return {make_op("softmax_with_cross_entropy_grad",
                  {{"Softmax", {fwd.out("Softmax")}}, {"Label", {fwd.in("Label")}}, {"Loss@GRAD", {dloss}}},
                  {{"Logits@GRAD", {dx}}}, widening::grad_attrs(fwd, g.program, fwd.in("Logits"), fwd.out("Softmax")))};
}

MIX_REGISTER_OP("softmax_with_cross_entropy", OpInfo{infer_swce, swce_cpu, {}, swce_grad_maker});
MIX_REGISTER_OP("softmax_with_cross_entropy_grad", OpInfo{{}, swce_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
