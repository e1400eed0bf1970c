// elementwise_mul: Out = X * Y with Paddle broadcasting (runtime/ops/broadcast.h).
// Grads: dX = dOut * Y (broadcast like the forward), dY = sum of dOut * X over
// the broadcast dims, accumulated in FP32 and rounded once on store.
#include <vector>

#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"
#include "runtime/ops/broadcast.h"
#include "runtime/ops/gemm.h"

namespace mix {
namespace {

void mul_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Tensor& y = ctx.in("Y");
  check_same_dtype(x, y, "elementwise_mul");
  const BroadcastDims d = broadcast_dims(x.shape(), y.shape(), ctx.attr<int>("axis", -1), "elementwise_mul");
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  cpu::dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    broadcast_binary(x.data<T>(), y.data<T>(), out.data<T>(), d, fn::Mul{});
  });
}

void mul_grad_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Tensor& y = ctx.in("Y");
  const Tensor& dout = ctx.in("Out@GRAD");
  check_same_dtype(x, y, "elementwise_mul_grad");
  MIX_CHECK(dout.shape() == x.shape() && dout.dtype() == x.dtype(),
            "elementwise_mul_grad: Out@GRAD " << shape_str(dout.shape()) << " does not match X " << shape_str(x.shape()));
  const BroadcastDims d = broadcast_dims(x.shape(), y.shape(), ctx.attr<int>("axis", -1), "elementwise_mul_grad");
  cpu::dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (ctx.wants("X@GRAD")) {
      Tensor& dx = ctx.out("X@GRAD", x.shape(), x.dtype());
      broadcast_binary(dout.data<T>(), y.data<T>(), dx.data<T>(), d, fn::Mul{});
    }
    if (ctx.wants("Y@GRAD")) {
      std::vector<float> acc(static_cast<size_t>(d.n));
      broadcast_reduce(dout.data<T>(), x.data<T>(), acc.data(), d, fn::Mul{});
      Tensor& dy = ctx.out("Y@GRAD", y.shape(), y.dtype());
      cpu::store_f32(acc.data(), dy);
    }
  });
}

std::vector<OpDesc> mul_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dx = g.grad_for_input(fwd.in("X"));
  const std::string dy = g.grad_for_input(fwd.in("Y"));
  return {make_op("elementwise_mul_grad",
                  {{"X", {fwd.in("X")}}, {"Y", {fwd.in("Y")}}, {"Out@GRAD", {g.grad_of_output(fwd.out("Out"))}}},
                  {{"X@GRAD", {dx}}, {"Y@GRAD", {dy}}}, fwd.attrs)};
}

MIX_REGISTER_OP("elementwise_mul", OpInfo{infer_elementwise, mul_cpu, {}, mul_grad_maker});
MIX_REGISTER_OP("elementwise_mul_grad", OpInfo{{}, mul_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
