// elementwise_add: Out = X + Y with Paddle broadcasting (runtime/ops/broadcast.h),
// typically a bias Y [out] added to X [B, out], or a residual of X's shape.
// The grad reads only Y (for its shape) and Out@GRAD, so X need not stay alive
// until the backward pass: dX = dOut, dY = dOut summed over the broadcast dims
// in FP32 and rounded once on store. Pass-through gradients are views of dOut
// where that is safe (runtime/ops/add_grad_views.h).
#include <cstring>
#include <vector>

#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"
#include "runtime/ops/add_grad_views.h"
#include "runtime/ops/broadcast.h"
#include "runtime/ops/gemm.h"

namespace mix {
namespace {

void add_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Tensor& y = ctx.in("Y");
  check_same_dtype(x, y, "elementwise_add");
  const BroadcastDims d = broadcast_dims(x.shape(), y.shape(), ctx.attr<int>("axis", -1), "elementwise_add");
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  cpu::dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    broadcast_binary(x.data<T>(), y.data<T>(), out.data<T>(), d, fn::Add{});
  });
}

void add_grad_cpu(OpContext& ctx) {
  const Tensor& y = ctx.in("Y");
  const Tensor& dout = ctx.in("Out@GRAD");
  const BroadcastDims d = broadcast_dims(dout.shape(), y.shape(), ctx.attr<int>("axis", -1), "elementwise_add_grad");
  const AddGradLeft left = bind_add_grad_views(ctx, dout, y);
  if (left.x) {
    // A copy: this gradient is written in place later on.
    Tensor& dx = ctx.out("X@GRAD", dout.shape(), dout.dtype());
    if (dout.bytes()) std::memcpy(dx.raw(), dout.raw(), dout.bytes());
  }
  if (left.y) {
    Tensor& dy = ctx.out("Y@GRAD", y.shape(), y.dtype());
    if (d.same_shape()) {
      if (dout.bytes()) std::memcpy(dy.raw(), dout.raw(), dout.bytes());
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

std::vector<OpDesc> add_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dx = g.grad_for_input(fwd.in("X"));
  const std::string dy = g.grad_for_input(fwd.in("Y"));
  std::map<std::string, Attr> attrs = fwd.attrs;
  // dX always has dOut's shape and dtype; dY only when Y has Out's.
  const VarDesc& y = g.program.var(fwd.in("Y"));
  const VarDesc& out = g.program.var(fwd.out("Out"));
  if (!dx.empty() && !gradient_written_in_place(g.program, fwd.in("X"))) attrs["x_grad_is_view"] = true;
  if (!dy.empty() && y.shape == out.shape && y.dtype == out.dtype && !gradient_written_in_place(g.program, fwd.in("Y")))
    attrs["y_grad_is_view"] = true;
  return {make_op("elementwise_add_grad", {{"Y", {fwd.in("Y")}}, {"Out@GRAD", {g.grad_of_output(fwd.out("Out"))}}},
                  {{"X@GRAD", {dx}}, {"Y@GRAD", {dy}}}, attrs)};
}

MIX_REGISTER_OP("elementwise_add", OpInfo{infer_elementwise, add_cpu, {}, add_grad_maker});
MIX_REGISTER_OP("elementwise_add_grad", OpInfo{{}, add_grad_cpu, {}, {}, add_grad_viewed_input});

}  // namespace
}  // namespace mix
