// softmax along the last axis (Paddle's attr axis: -1 or ndim - 1; other axes are
// refused, transpose first). Max-subtracted, FP32 math, rounded on store; row
// math in runtime/kernels/softmax_row.h. softmax is on the AMP black list.
// Grad (softmax_grad) reads the forward output: dX = Y * (dY - sum(dY * Y)).
//
// Attr causal (bool, default false): attention's causal mask, fused so that no
// [T, S] mask tensor and no -inf logits are ever materialised. X is then
// [..., T, S] (queries by keys, T <= S) and row r holds query i = r mod T,
// which sees keys j <= i + (S - T); later keys get probability exactly 0, as
// if their logits were -inf (softmax_row_prefix). The grad runs over the same
// prefix (softmax_grad_row_prefix): the formula gives 0 beyond it anyway,
// since Y is 0 there, but only for finite dY. T > S would leave rows with no
// visible key (NaN), so it is refused.
//
// Attr out_dtype "f32" (amp::fold_widening_casts, runtime/ops/widening.h): an
// FP16/BF16 X gives an FP32 Out, the values of softmax(cast(X, f32)); the grad
// then writes X@GRAD in X's dtype (attr x_grad_dtype). The grad also reads an
// FP16/BF16 Out@GRAD of an FP32 Out, widened on load
// (amp::fold_widening_grad_casts).
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/softmax_row.h"
#include "runtime/ops/softmax_shapes.h"
#include "runtime/ops/widening.h"

namespace mix {
namespace {

using softmax_rules::check_axis;
using softmax_rules::check_causal;
using softmax_rules::Rows;
using softmax_rules::rows_of;

void infer_softmax(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  check_axis(op.attr<int64_t>("axis", -1), x.shape.size(), "softmax");
  check_causal(op, x.shape, "X " + x.name);
  declare_var(p, op.out("Out"), x.shape, widening::out_dtype(op, x.dtype));
}

void softmax_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Rows r = rows_of(ctx.op, x.shape(), "X");
  Tensor& out = ctx.out("Out", x.shape(), widening::out_dtype(ctx.op, x.dtype()));
  widening::dispatch(x.dtype(), out.dtype(), [&](auto x_tag, auto y_tag) {
    const auto* xs = x.data<decltype(x_tag)>();
    auto* ys = out.data<decltype(y_tag)>();
    std::vector<float> xbuf, ybuf;  // a row as floats, for FP16/BF16 storage (cpu::widened_row)
    for (int64_t i = 0; i < r.rows; ++i) {
      const int64_t o = i * r.cols;
      const float* xr = cpu::widened_row(xs + o, r.cols, xbuf);
      float* yr = cpu::float_row_for(ys + o, r.cols, ybuf);
      if (r.t > 0)
        fn::softmax_row_prefix(xr, yr, r.cols, r.valid(i));
      else
        fn::softmax_row(xr, yr, r.cols);
      cpu::narrowed_row(yr, ys + o, r.cols);
    }
  });
}

void softmax_grad_cpu(OpContext& ctx) {
  const Tensor& y = ctx.in("Out");
  const Tensor& dy = ctx.in("Out@GRAD");
  MIX_CHECK(y.shape() == dy.shape() && widening::allowed(dy.dtype(), y.dtype()),
            "softmax_grad: Out@GRAD " << dtype_name(dy.dtype()) << shape_str(dy.shape()) << " does not match Out "
                                      << dtype_name(y.dtype()) << shape_str(y.shape()));
  const Rows r = rows_of(ctx.op, y.shape(), "Out");
  Tensor& dx = ctx.out("X@GRAD", y.shape(), widening::x_grad_dtype(ctx.op, y.dtype()));
  widening::dispatch(dx.dtype(), y.dtype(), [&](auto dx_tag, auto y_tag) {
    using Y = decltype(y_tag);
    widening::dispatch_grad_input<Y>(dy.dtype(), y.dtype(), [&](auto dy_tag) {
      const Y* ys = y.data<Y>();
      const auto* dys = dy.data<decltype(dy_tag)>();
      auto* dxs = dx.data<decltype(dx_tag)>();
      std::vector<float> ybuf, dybuf, dxbuf;
      for (int64_t i = 0; i < r.rows; ++i) {
        const int64_t o = i * r.cols;
        const float* yr = cpu::widened_row(ys + o, r.cols, ybuf);
        const float* dyr = cpu::widened_row(dys + o, r.cols, dybuf);
        float* dxr = cpu::float_row_for(dxs + o, r.cols, dxbuf);
        if (r.t > 0)
          fn::softmax_grad_row_prefix(yr, dyr, dxr, r.cols, r.valid(i));
        else
          fn::softmax_grad_row(yr, dyr, dxr, r.cols);
        cpu::narrowed_row(dxr, dxs + o, r.cols);
      }
    });
  });
}

std::vector<OpDesc> softmax_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dx = g.grad_for_input(fwd.in("X"));
  if (dx.empty()) return {};
  return {make_op("softmax_grad", {{"Out", {fwd.out("Out")}}, {"Out@GRAD", {g.grad_of_output(fwd.out("Out"))}}},
                  {{"X@GRAD", {dx}}}, widening::grad_attrs(fwd, g.program, fwd.in("X"), fwd.out("Out")))};
}

MIX_REGISTER_OP("softmax", OpInfo{infer_softmax, softmax_cpu, {}, softmax_grad_maker});
MIX_REGISTER_OP("softmax_grad", OpInfo{{}, softmax_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
