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
#include "runtime/check.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/softmax_row.h"
#include "runtime/op_registry.h"
#include "runtime/ops/softmax_shapes.h"

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
  declare_var(p, op.out("Out"), x.shape, x.dtype);
}

void softmax_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Rows r = rows_of(ctx.op, x.shape(), "X");
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  cpu::dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xs = x.data<T>();
    T* ys = out.data<T>();
    for (int64_t i = 0; i < r.rows; ++i) {
      if (r.t > 0)
        fn::softmax_row_prefix(xs + i * r.cols, ys + i * r.cols, r.cols, r.valid(i));
      else
        fn::softmax_row(xs + i * r.cols, ys + i * r.cols, r.cols);
    }
  });
}

void softmax_grad_cpu(OpContext& ctx) {
  const Tensor& y = ctx.in("Out");
  const Tensor& dy = ctx.in("Out@GRAD");
  MIX_CHECK(y.shape() == dy.shape() && y.dtype() == dy.dtype(),
            "softmax_grad: Out@GRAD " << shape_str(dy.shape()) << " does not match Out " << shape_str(y.shape()));
  const Rows r = rows_of(ctx.op, y.shape(), "Out");
  Tensor& dx = ctx.out("X@GRAD", y.shape(), y.dtype());
  cpu::dispatch_floating(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* ys = y.data<T>();
    const T* dys = dy.data<T>();
    T* dxs = dx.data<T>();
    for (int64_t i = 0; i < r.rows; ++i) {
      const int64_t o = i * r.cols;
      if (r.t > 0)
        fn::softmax_grad_row_prefix(ys + o, dys + o, dxs + o, r.cols, r.valid(i));
      else
        fn::softmax_grad_row(ys + o, dys + o, dxs + o, r.cols);
    }
  });
}

std::vector<OpDesc> softmax_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dx = g.grad_for_input(fwd.in("X"));
  if (dx.empty()) return {};
  return {make_op("softmax_grad", {{"Out", {fwd.out("Out")}}, {"Out@GRAD", {g.grad_of_output(fwd.out("Out"))}}},
                  {{"X@GRAD", {dx}}}, fwd.attrs)};
}

MIX_REGISTER_OP("softmax", OpInfo{infer_softmax, softmax_cpu, {}, softmax_grad_maker});
MIX_REGISTER_OP("softmax_grad", OpInfo{{}, softmax_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
