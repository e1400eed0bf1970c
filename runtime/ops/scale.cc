// scale: Out = scale * X + bias (Paddle's bias_after_scale=true default).
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"

namespace mix {
namespace {

void scale_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  cpu::unary_tensor(x, out,
                    fn::Scale{ctx.attr<float>("scale", 1.f), ctx.attr<float>("bias", 0.f),
                              ctx.attr<bool>("bias_after_scale", true)});
}

// d/dX (s X + b) = s: the gradient is a scale with no bias.
std::vector<OpDesc> scale_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dx = g.grad_for_input(fwd.in("X"));
  if (dx.empty()) return {};
  return {make_op("scale", {{"X", {g.grad_of_output(fwd.out("Out"))}}}, {{"Out", {dx}}},
                  {{"scale", fwd.attr<double>("scale", 1.0)}, {"bias", 0.0}})};
}

MIX_REGISTER_OP("scale", OpInfo{same_as_input(), scale_cpu, {}, scale_grad_maker});

}  // namespace
}  // namespace mix
