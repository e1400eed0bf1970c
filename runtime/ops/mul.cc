// mul: the fully connected product, Out[B, out] = X[B, in] . Y[out, in]^T.
// Y is in PyTorch's nn.Linear layout ([out_features, in_features]) so that
// checkpoints interchange with PyTorch state_dicts without transposes.
// X with more than two dims is flattened after x_num_col_dims (Paddle's rule).
#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/gemm.h"
#include "runtime/ops/gemm_shapes.h"

namespace mix {
namespace {


void infer_mul(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  const VarDesc& y = p.var(op.in("Y"));
  const int ncol = op.attr<int>("x_num_col_dims", 1);
  MIX_CHECK(x.dtype == y.dtype, "mul: input " << x.name << " is " << dtype_name(x.dtype) << " but weight " << y.name
                                              << " is " << dtype_name(y.dtype) << " (amp::rewrite inserts casts)");
  mul_dims(x.shape, y.shape, ncol);
  Shape out(x.shape.begin(), x.shape.begin() + ncol);
  out.push_back(y.shape[0]);
  declare_var(p, op.out("Out"), out, x.dtype);
}

void mul_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Tensor& y = ctx.in("Y");
  const int ncol = ctx.attr<int>("x_num_col_dims", 1);
  const MulDims d = mul_dims(x.shape(), y.shape(), ncol);
  Shape out_shape(x.shape().begin(), x.shape().begin() + ncol);
  out_shape.push_back(d.out);
  Tensor& out = ctx.out("Out", out_shape, x.dtype());
  cpu::gemm_tensors(false, true, d.rows, d.out, d.in, x, y, out);
}

// dX[B, in] = dOut[B, out] . Y[out, in];  dY[out, in] = dOut^T[out, B] . X[B, in].
void mul_grad_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Tensor& y = ctx.in("Y");
  const Tensor& dout = ctx.in("Out@GRAD");
  const MulDims d = mul_dims(x.shape(), y.shape(), ctx.attr<int>("x_num_col_dims", 1));
  if (ctx.wants("X@GRAD")) {
    Tensor& dx = ctx.out("X@GRAD", x.shape(), x.dtype());
    cpu::gemm_tensors(false, false, d.rows, d.in, d.out, dout, y, dx);
  }
  if (ctx.wants("Y@GRAD")) {
    Tensor& dy = ctx.out("Y@GRAD", y.shape(), y.dtype());
    cpu::gemm_tensors(true, false, d.out, d.in, d.rows, dout, x, dy);
  }
}

std::vector<OpDesc> mul_grad_maker(const OpDesc& fwd, GradContext& g) {
  OpDesc op = make_op("mul_grad", {{"X", {fwd.in("X")}}, {"Y", {fwd.in("Y")}}, {"Out@GRAD", {g.grad_of_output(fwd.out("Out"))}}},
                      {{"X@GRAD", {g.grad_for_input(fwd.in("X"))}}, {"Y@GRAD", {g.grad_for_input(fwd.in("Y"))}}},
                      fwd.attrs);
  return {op};
}

MIX_REGISTER_OP("mul", OpInfo{infer_mul, mul_cpu, {}, mul_grad_maker});
MIX_REGISTER_OP("mul_grad", OpInfo{{}, mul_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
