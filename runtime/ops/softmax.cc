// softmax along the last axis (Paddle's attr axis: -1 or ndim - 1; other axes are
// refused, transpose first). Max-subtracted, FP32 math, rounded on store; row
// math in runtime/kernels/softmax_row.h. softmax is on the AMP black list.
// Grad (softmax_grad) reads the forward output: dX = Y * (dY - sum(dY * Y)).
#include "runtime/check.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/softmax_row.h"
#include "runtime/op_registry.h"

namespace mix {
namespace {

/// Rows and row length of X [..., C], after checking the axis attribute.
struct Rows {
  int64_t rows, cols;
};

void check_axis(int64_t axis, size_t ndim, const std::string& op) {
  const int64_t last = static_cast<int64_t>(ndim) - 1;
  MIX_CHECK(ndim >= 1, op << ": input must have at least one dim");
  MIX_CHECK(axis == -1 || axis == last,
            op << ": only the last axis is supported (axis -1 or " << last << "), got axis " << axis
               << "; transpose the softmax axis to the end first");
}

Rows rows_of(const Shape& s) {
  const int64_t cols = s.back();
  return {cols == 0 ? 0 : shape_numel(s) / cols, cols};
}

void infer_softmax(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  check_axis(op.attr<int64_t>("axis", -1), x.shape.size(), "softmax");
  declare_var(p, op.out("Out"), x.shape, x.dtype);
}

void softmax_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  check_axis(ctx.attr<int64_t>("axis", -1), x.shape().size(), "softmax");
  const Rows r = rows_of(x.shape());
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  cpu::dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xs = x.data<T>();
    T* ys = out.data<T>();
    for (int64_t i = 0; i < r.rows; ++i) fn::softmax_row(xs + i * r.cols, ys + i * r.cols, r.cols);
  });
}

void softmax_grad_cpu(OpContext& ctx) {
  const Tensor& y = ctx.in("Out");
  const Tensor& dy = ctx.in("Out@GRAD");
  MIX_CHECK(y.shape() == dy.shape() && y.dtype() == dy.dtype(),
            "softmax_grad: Out@GRAD " << shape_str(dy.shape()) << " does not match Out " << shape_str(y.shape()));
  const Rows r = rows_of(y.shape());
  Tensor& dx = ctx.out("X@GRAD", y.shape(), y.dtype());
  cpu::dispatch_floating(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* ys = y.data<T>();
    const T* dys = dy.data<T>();
    T* dxs = dx.data<T>();
    for (int64_t i = 0; i < r.rows; ++i)
      fn::softmax_grad_row(ys + i * r.cols, dys + i * r.cols, dxs + i * r.cols, r.cols);
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
