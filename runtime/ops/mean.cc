// mean: Out[1] = the mean of all elements of X, in X's dtype. The sum runs in
// double (exact enough for any tensor a step holds: 2^53 ulps of headroom), so
// the only rounding is the one store into Out. mean is on the AMP black list,
// so under AMP its input is FP32 anyway.
// Grad (mean_grad): dX[i] = dOut[0] / numel(X), in X's shape and dtype.
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"
#include "runtime/ops/gemm.h"

namespace mix {
namespace {

void infer_mean(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  MIX_CHECK(is_floating(x.dtype), "mean: X " << x.name << " is " << dtype_name(x.dtype) << ", expected a float dtype");
  declare_var(p, op.out("Out"), {1}, x.dtype);
}

void mean_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const int64_t n = x.numel();
  MIX_CHECK(n > 0, "mean of an empty tensor " << shape_str(x.shape()));
  double s = 0.0;
  cpu::dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* v = x.data<T>();
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(to_float(v[i]));
  });
  const float m = fn::mean_from_sum(s, n);
  Tensor& out = ctx.out("Out", {1}, x.dtype());
  cpu::store_f32(&m, out);
}

void mean_grad_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Tensor& dout = ctx.in("Out@GRAD");
  MIX_CHECK(dout.numel() == 1, "mean_grad: Out@GRAD must hold one value, has shape " << shape_str(dout.shape()));
  // The quotient is formed in double and rounded once, so numel beyond 2^24 loses nothing extra.
  const float g = fn::mean_grad_value(dout.item_float(0), x.numel());
  Tensor& dx = ctx.out("X@GRAD", x.shape(), x.dtype());
  std::vector<float> v(static_cast<size_t>(x.numel()), g);
  cpu::store_f32(v.data(), dx);
}

std::vector<OpDesc> mean_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dx = g.grad_for_input(fwd.in("X"));
  if (dx.empty()) return {};
  return {make_op("mean_grad", {{"X", {fwd.in("X")}}, {"Out@GRAD", {g.grad_of_output(fwd.out("Out"))}}},
                  {{"X@GRAD", {dx}}})};
}

MIX_REGISTER_OP("mean", OpInfo{infer_mean, mean_cpu, {}, mean_grad_maker});
MIX_REGISTER_OP("mean_grad", OpInfo{{}, mean_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
