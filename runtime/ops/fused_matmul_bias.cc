// fused_matmul_bias: Out = alpha * X . op(Y) + Bias in one op, the bias added
// to the FP32 product before the one rounding to X's dtype: a linear layer's
// matmul and bias add, which runtime/passes/fuse_matmul_bias.h joins. On
// CUDA the bias rides in the GEMM's epilogue (cuBLASLt), as PyTorch's addmm
// adds a linear layer's bias, so the product is never written and reread.
//   inputs  X [..., M, K]; Y [K, N], or [N, K] with transpose_Y: 2-D, shared by
//           every batch entry (a weight); Bias [N]; all of one dtype
//   outputs Out [..., M, N]
//   attrs   transpose_Y, alpha (as matmul's; X is never transposed)
// Against matmul then elementwise_add: in FP32 the same values (the product
// in FP32, then + Bias in FP32, rounded as the add rounds it); in FP16 and
// BF16 one rounding instead of two (the product's, then the sum's), so the
// fused op is nearer the exact value, by at most the half ulp of the product's
// rounding. No gradient op: the pass runs after backward, whose matmul_grad
// and elementwise_add_grad read neither the product nor Out.
#include <algorithm>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/fused_matmul_bias_shapes.h"
#include "runtime/ops/gemm.h"

namespace mix {
namespace {

using matmul_bias::dims_of;

void infer_fused_matmul_bias(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  const VarDesc& y = p.var(op.in("Y"));
  const VarDesc& b = p.var(op.in("Bias"));
  const MatmulDims d = dims_of(op, x.shape, y.shape, b.shape, x.dtype, y.dtype, b.dtype);
  declare_var(p, op.out("Out"), d.out(), x.dtype);
}

void fused_matmul_bias_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Tensor& y = ctx.in("Y");
  const Tensor& bias = ctx.in("Bias");
  const MatmulDims d = dims_of(ctx.op, x.shape(), y.shape(), bias.shape(), x.dtype(), y.dtype(), bias.dtype());
  const bool ty = ctx.op.attr<bool>("transpose_Y", false);
  const float alpha = static_cast<float>(ctx.op.attr<double>("alpha", 1.0));
  Tensor& out = ctx.out("Out", d.out(), x.dtype());
  const int64_t rows = d.count * d.m;  // the batch is more rows of one GEMM: Y is shared
  std::vector<float> acc(static_cast<size_t>(rows * d.n), 0.f);
  if (d.k > 0 && rows > 0 && d.n > 0)  // an empty sum stays 0 (BLAS refuses a leading dimension of 0)
    cpu::sgemm(false, ty, rows, d.n, d.k, alpha, cpu::as_f32(x, 0), cpu::as_f32(y, 1), 0.f, acc.data());
  const float* b = cpu::as_f32(bias, 2);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < d.n; ++c) acc[static_cast<size_t>(r * d.n + c)] += b[c];
  cpu::store_f32(acc.data(), out);  // the one rounding
}

MIX_REGISTER_OP("fused_matmul_bias", OpInfo{infer_fused_matmul_bias, fused_matmul_bias_cpu, {}, {}});

}  // namespace
}  // namespace mix
