// Two fused ops that runtime/passes/fuse_add_relu.h puts where a ResNet's residual
// adds meet their relu, forward and backward:
//
//   fused_add_relu        Out = relu(X + Y), X and Y of one shape and dtype:
//                         elementwise_add then relu, without writing and
//                         rereading the sum;
//   fused_sum_relu_grad   X@GRAD = Out <= 0 ? 0 : Out@GRAD[0] + Out@GRAD[1] + ...
//                         (a NaN Out passes the sum, as relu_grad):
//                         autodiff's sum of a gradient's contributions, then
//                         relu_grad, without writing and rereading the sum.
//
// Both give the bits of the two ops they replace: the sum is added in FP32 in
// input order as sum's (runtime/ops/sum.h), relu commutes with the rounding
// (fn::AddRelu), and relu_grad passes the rounded sum through or writes 0.
// They exist only after autodiff (the pass runs on the training program), so
// neither has a gradient of its own.
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"
#include "runtime/ops/gemm.h"
#include "runtime/ops/sum.h"

namespace mix {
namespace {

void infer_add_relu(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  const VarDesc& y = p.var(op.in("Y"));
  MIX_CHECK(x.shape == y.shape && x.dtype == y.dtype,
            "fused_add_relu: X " << dtype_name(x.dtype) << shape_str(x.shape) << " and Y " << dtype_name(y.dtype)
                                 << shape_str(y.shape) << " must match (no broadcasting)");
  declare_var(p, op.out("Out"), x.shape, x.dtype);
}

void add_relu_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Tensor& y = ctx.in("Y");
  MIX_CHECK(x.shape() == y.shape() && x.dtype() == y.dtype(),
            "fused_add_relu: X " << dtype_name(x.dtype()) << shape_str(x.shape()) << " and Y " << dtype_name(y.dtype())
                                 << shape_str(y.shape()) << " must match");
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  cpu::binary_tensor(x, y, out, fn::AddRelu{});
}

// X@GRAD has Out's shape and the gradients' dtype, as relu_grad's.
void infer_sum_relu_grad(Program& p, OpDesc& op) {
  const VarDesc& out = p.var(op.in("Out"));
  const VarDesc& dout = p.var(op.ins("Out@GRAD").at(0));
  declare_var(p, op.out("X@GRAD"), out.shape, dout.dtype);
}

void sum_relu_grad_cpu(OpContext& ctx) {
  const Tensor& out = ctx.in("Out");
  const std::vector<const Tensor*> parts = ctx.ins("Out@GRAD");
  std::vector<float> acc = sum_in_f32(parts, "fused_sum_relu_grad");
  MIX_CHECK(static_cast<int64_t>(acc.size()) == out.numel() && out.dtype() == parts[0]->dtype(),
            "fused_sum_relu_grad: Out " << dtype_name(out.dtype()) << shape_str(out.shape())
                                        << " does not match the gradient " << dtype_name(parts[0]->dtype())
                                        << shape_str(parts[0]->shape()));
  const float* y = cpu::as_f32(out, 3);  // sum_in_f32 uses scratch slot 4
  const fn::ReluBwd mask;
  for (size_t i = 0; i < acc.size(); ++i) acc[i] = mask(y[i], acc[i]);
  Tensor& dx = ctx.out("X@GRAD", out.shape(), out.dtype());  // relu_grad's shape: Out's
  cpu::store_f32(acc.data(), dx);
}

MIX_REGISTER_OP("fused_add_relu", OpInfo{infer_add_relu, add_relu_cpu, {}, {}});
MIX_REGISTER_OP("fused_sum_relu_grad", OpInfo{infer_sum_relu_grad, sum_relu_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
