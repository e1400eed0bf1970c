// matmul: Out = alpha * op(X) . op(Y), op = transpose of the last two dims when
// transpose_X / transpose_Y is set (Paddle's matmul). X is [..., M, K] (or
// [..., K, M] transposed), Y is [..., K, N] with the same leading batch dims, or
// 2-D and shared by every batch entry (activations times a weight). Out is
// [..., M, N]. Inputs are widened to FP32 (cpu::as_f32) and multiplied by
// SGEMM with FP32 accumulation; the result is rounded to X's dtype once.
//
// Grads (matmul_grad), all scaled by alpha, per batch entry:
//   no transposes:  dX = dOut . Y^T        dY = X^T . dOut
//   transpose_X:    dX = Y . dOut^T        dY = X . dOut
//   transpose_Y:    dX = dOut . Y          dY = dOut^T . X
//   both:           dX = Y^T . dOut^T      dY = dOut^T . X^T
// A shared 2-D Y gets the sum over the batch (accumulated in FP32).
#include <algorithm>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/gemm.h"
#include "runtime/ops/gemm_shapes.h"

namespace mix {
namespace {


struct Attrs {
  bool tx, ty;
  float alpha;
};
Attrs attrs_of(const OpDesc& op) {
  return {op.attr<bool>("transpose_X", false), op.attr<bool>("transpose_Y", false),
          static_cast<float>(op.attr<double>("alpha", 1.0))};
}

void infer_matmul(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  const VarDesc& y = p.var(op.in("Y"));
  MIX_CHECK(x.dtype == y.dtype, "matmul: X " << x.name << " is " << dtype_name(x.dtype) << " but Y " << y.name
                                             << " is " << dtype_name(y.dtype) << " (amp::rewrite inserts casts)");
  const Attrs a = attrs_of(op);
  declare_var(p, op.out("Out"), matmul_dims(x.shape, y.shape, a.tx, a.ty).out(), x.dtype);
}

// count GEMMs C_i = alpha op(A_i) op(B_i), operands `stride` floats apart.
// With `accumulate` every C_i is the same matrix (stride 0) and the products
// are summed into it, in FP32.
void gemm_batched(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t sa,
                  const float* b, int64_t sb, float* c, int64_t sc, int64_t count, bool accumulate) {
  if (accumulate || k == 0) std::fill(c, c + (accumulate ? m * n : m * n * count), 0.f);
  if (k == 0) return;  // an empty sum: zeros (and BLAS refuses a leading dimension of 0)
  for (int64_t i = 0; i < count; ++i)
    cpu::sgemm(ta, tb, m, n, k, alpha, a + i * sa, b + i * sb, accumulate ? 1.f : 0.f, c + i * sc);
}

// FP32 destination for a tensor: its own data for f32, else `tmp` (stored by finish()).
float* f32_dest(Tensor& t, std::vector<float>& tmp) {
  if (t.dtype() == DType::f32) return t.data<float>();
  tmp.resize(static_cast<size_t>(t.numel()));
  return tmp.data();
}
void finish(Tensor& t, const std::vector<float>& tmp) {
  if (t.dtype() != DType::f32) cpu::store_f32(tmp.data(), t);
}

void check_runtime(const Tensor& x, const Tensor& y) {
  MIX_CHECK(x.dtype() == y.dtype(),
            "matmul: X is " << dtype_name(x.dtype()) << " but Y is " << dtype_name(y.dtype()));
}

void matmul_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Tensor& y = ctx.in("Y");
  check_runtime(x, y);
  const Attrs a = attrs_of(ctx.op);
  const MatmulDims d = matmul_dims(x.shape(), y.shape(), a.tx, a.ty);
  Tensor& out = ctx.out("Out", d.out(), x.dtype());
  const float* xf = cpu::as_f32(x, 0);
  const float* yf = cpu::as_f32(y, 1);
  std::vector<float> tmp;
  float* of = f32_dest(out, tmp);
  // A shared Y under an untransposed X: the batch is just more rows of one GEMM.
  const bool fold = d.y_shared && !a.tx;
  const int64_t count = fold ? 1 : d.count, rows = fold ? d.count * d.m : d.m;
  gemm_batched(a.tx, a.ty, rows, d.n, d.k, a.alpha, xf, d.m * d.k, yf, d.y_shared ? 0 : d.k * d.n, of, d.m * d.n,
               count, false);
  finish(out, tmp);
}

void matmul_grad_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Tensor& y = ctx.in("Y");
  const Tensor& dout = ctx.in("Out@GRAD");
  check_runtime(x, y);
  const Attrs a = attrs_of(ctx.op);
  const MatmulDims d = matmul_dims(x.shape(), y.shape(), a.tx, a.ty);
  MIX_CHECK(dout.shape() == d.out(), "matmul_grad: Out@GRAD " << shape_str(dout.shape()) << " does not match Out "
                                                              << shape_str(d.out()));
  const float* xf = cpu::as_f32(x, 0);
  const float* yf = cpu::as_f32(y, 1);
  const float* gf = cpu::as_f32(dout, 2);
  const bool fold = d.y_shared && !a.tx;
  const int64_t count = fold ? 1 : d.count, rows = fold ? d.count * d.m : d.m;
  const int64_t sx = d.m * d.k, sy = d.y_shared ? 0 : d.k * d.n, sg = d.m * d.n;
  std::vector<float> tmp;
  if (ctx.wants("X@GRAD")) {
    Tensor& dx = ctx.out("X@GRAD", x.shape(), x.dtype());
    float* f = f32_dest(dx, tmp);
    if (!a.tx)  // dX[M, K] = dOut . op(Y)^T
      gemm_batched(false, !a.ty, rows, d.k, d.n, a.alpha, gf, sg, yf, sy, f, sx, count, false);
    else  // dX[K, M] = op(Y) . dOut^T
      gemm_batched(a.ty, true, d.k, d.m, d.n, a.alpha, yf, sy, gf, sg, f, sx, count, false);
    finish(dx, tmp);
  }
  if (ctx.wants("Y@GRAD")) {
    Tensor& dy = ctx.out("Y@GRAD", y.shape(), y.dtype());
    float* f = f32_dest(dy, tmp);
    const bool acc = d.y_shared && count > 1;
    const int64_t sdy = d.y_shared ? 0 : d.k * d.n;
    if (!a.ty)  // dY[K, N] = op(X)^T . dOut
      gemm_batched(!a.tx, false, d.k, d.n, rows, a.alpha, xf, sx, gf, sg, f, sdy, count, acc);
    else  // dY[N, K] = dOut^T . op(X)
      gemm_batched(true, a.tx, d.n, d.k, rows, a.alpha, gf, sg, xf, sx, f, sdy, count, acc);
    finish(dy, tmp);
  }
}

std::vector<OpDesc> matmul_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dx = g.grad_for_input(fwd.in("X"));
  const std::string dy = g.grad_for_input(fwd.in("Y"));
  return {make_op("matmul_grad",
                  {{"X", {fwd.in("X")}}, {"Y", {fwd.in("Y")}}, {"Out@GRAD", {g.grad_of_output(fwd.out("Out"))}}},
                  {{"X@GRAD", {dx}}, {"Y@GRAD", {dy}}}, fwd.attrs)};
}

MIX_REGISTER_OP("matmul", OpInfo{infer_matmul, matmul_cpu, {}, matmul_grad_maker});
MIX_REGISTER_OP("matmul_grad", OpInfo{{}, matmul_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
