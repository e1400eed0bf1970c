// elementwise_add: Out = X + Y with Paddle broadcasting (runtime/ops/broadcast.h),
// typically a bias Y [out] added to X [B, out], or a residual of X's shape.
//
// Y may be narrower than X where it has X's shape: an FP16 (or BF16) Y beside
// an FP32 X, widened on load (exact), the sum computed and stored in FP32.
// That is AMP's residual add: amp::fold_widening_casts gives it the FP16
// output of a block's last linear layer instead of that output cast to FP32,
// the same bits with no FP32 copy written and read (amp/fold_casts.h).
//
// The grad reads only Out@GRAD: X and Y need not stay alive until the
// backward pass (a residual block's output, a cast's FP32 copy). Y's shape and
// dtype, which it needs, are the grad maker's attrs y_shape (declared, -1 for
// the batch, which the kernel takes from Out@GRAD) and y_dtype.
// dX = dOut; dY = dOut summed over the broadcast dims in FP32 and rounded
// once on store to Y's dtype (a narrower Y's gradient: dOut rounded once, as
// the removed cast's gradient rounds it). Pass-through gradients are views of
// dOut where that is safe (runtime/ops/add_grad_views.h).
#include <cstring>
#include <vector>

#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"
#include "runtime/ops/add_grad_views.h"
#include "runtime/ops/broadcast.h"
#include "runtime/ops/elementwise_add_shapes.h"
#include "runtime/ops/gemm.h"

namespace mix {
namespace {

void add_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Tensor& y = ctx.in("Y");
  const BroadcastDims d = broadcast_dims(x.shape(), y.shape(), ctx.attr<int>("axis", -1), "elementwise_add");
  add_rules::check_dtypes(x.dtype(), y.dtype(), d.same_shape());
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  if (x.dtype() != y.dtype()) {  // a narrower Y of X's shape (checked above)
    cpu::dispatch_floating(y.dtype(), [&](auto tag) {
      cpu::binary(x.data<float>(), y.data<decltype(tag)>(), out.data<float>(), x.numel(), fn::Add{});
    });
    return;
  }
  cpu::dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    broadcast_binary(x.data<T>(), y.data<T>(), out.data<T>(), d, fn::Add{});
  });
}

void add_grad_cpu(OpContext& ctx) {
  const Tensor& dout = ctx.in("Out@GRAD");
  const add_rules::AddGradY y = add_rules::grad_y(ctx, dout);
  const BroadcastDims d = broadcast_dims(dout.shape(), y.shape, ctx.attr<int>("axis", -1), "elementwise_add_grad");
  const AddGradLeft left = bind_add_grad_views(ctx, dout, y);
  if (left.x) {
    // A copy: this gradient is written in place later on.
    Tensor& dx = ctx.out("X@GRAD", dout.shape(), dout.dtype());
    if (dout.bytes()) std::memcpy(dx.raw(), dout.raw(), dout.bytes());
  }
  if (left.y) {
    Tensor& dy = ctx.out("Y@GRAD", y.shape, y.dtype);
    if (d.same_shape()) {
      if (dy.dtype() == dout.dtype()) {
        if (dout.bytes()) std::memcpy(dy.raw(), dout.raw(), dout.bytes());
      } else {
        cpu::store_f32(dout.data<float>(), dy);  // a narrower Y's: dOut (f32, as X) rounded once
      }
      return;
    }
    std::vector<float> acc(static_cast<size_t>(d.n));
    cpu::dispatch_floating(dout.dtype(), [&](auto tag) {
      using T = decltype(tag);
      broadcast_reduce(dout.data<T>(), static_cast<const T*>(nullptr), acc.data(), d, fn::TakeFirst{});
    });
    cpu::store_f32(acc.data(), dy);
  }
}

void infer_add(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  const VarDesc& y = p.var(op.in("Y"));
  if (x.dtype == y.dtype) return infer_elementwise(p, op);
  check_broadcast_desc(x.shape, y.shape, op.attr<int>("axis", -1), op.type);
  add_rules::check_dtypes(x.dtype, y.dtype, x.shape == y.shape);
  declare_var(p, op.out("Out"), x.shape, x.dtype);
}

std::vector<OpDesc> add_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dx = g.grad_for_input(fwd.in("X"));
  const std::string dy = g.grad_for_input(fwd.in("Y"));
  std::map<std::string, Attr> attrs = fwd.attrs;
  // dX always has dOut's shape and dtype; dY only when Y has Out's.
  const VarDesc& y = g.program.var(fwd.in("Y"));
  const VarDesc& out = g.program.var(fwd.out("Out"));
  attrs["y_shape"] = y.shape;
  attrs["y_dtype"] = std::string(dtype_name(y.dtype));
  if (!dx.empty() && !gradient_written_in_place(g.program, fwd.in("X"))) attrs["x_grad_is_view"] = true;
  if (!dy.empty() && y.shape == out.shape && y.dtype == out.dtype && !gradient_written_in_place(g.program, fwd.in("Y")))
    attrs["y_grad_is_view"] = true;
  return {make_op("elementwise_add_grad", {{"Out@GRAD", {g.grad_of_output(fwd.out("Out"))}}},
                  {{"X@GRAD", {dx}}, {"Y@GRAD", {dy}}}, attrs)};
}

MIX_REGISTER_OP("elementwise_add", OpInfo{infer_add, add_cpu, {}, add_grad_maker});
MIX_REGISTER_OP("elementwise_add_grad", OpInfo{{}, add_grad_cpu, {}, {}, add_grad_viewed_input});

}  // namespace
}  // namespace mix
