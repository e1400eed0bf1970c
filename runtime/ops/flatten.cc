// flatten: Out = X viewed as 2-D [prod(X.dims[:axis]), prod(X.dims[axis:])]
// (Paddle's flatten; axis 1 by default), e.g. ResNet's pooled [N, C, 1, 1] to
// the [N, C] its fc layer takes. A view of X's storage, like reshape2; its
// gradient is reshape2_grad (Out@GRAD viewed with X's runtime shape).
#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"

namespace mix {
namespace {

// The 2-D shape; a -1 (batch) dim makes its side -1.
Shape flatten_shape(const Shape& x, int64_t axis) {
  MIX_CHECK(axis >= 0 && axis <= static_cast<int64_t>(x.size()),
            "flatten: axis " << axis << " out of range for X " << shape_str(x));
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < x.size(); ++i) {
    int64_t& side = static_cast<int64_t>(i) < axis ? outer : inner;
    side = (x[i] < 0 || side < 0) ? -1 : side * x[i];
  }
  return {outer, inner};
}

void infer_flatten(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  declare_var(p, op.out("Out"), flatten_shape(x.shape, op.attr<int64_t>("axis", 1)), x.dtype);
}

void flatten_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  ctx.scope.set(ctx.op.out("Out"), x.reshaped(flatten_shape(x.shape(), ctx.attr<int64_t>("axis", 1))));
}

std::vector<OpDesc> flatten_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dx = g.grad_for_input(fwd.in("X"));
  if (dx.empty()) return {};
  // The gradient is Out@GRAD viewed with X's shape: reshape2's gradient op does exactly that.
  return {make_op("reshape2_grad", {{"X", {fwd.in("X")}}, {"Out@GRAD", {g.grad_of_output(fwd.out("Out"))}}},
                  {{"X@GRAD", {dx}}})};
}

// Views work on any device: the same kernel serves CUDA.
MIX_REGISTER_OP("flatten", OpInfo{infer_flatten, flatten_cpu, flatten_cpu, flatten_grad_maker, views_of("X")});

}  // namespace
}  // namespace mix
