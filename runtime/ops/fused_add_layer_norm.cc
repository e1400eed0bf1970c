// fused_add_layer_norm: a residual add and the layer_norm that reads its
// output, as one op (runtime/passes/fuse_add_layer_norm.h):
//   inputs  X, Y: elementwise_add's operands (Y of X's shape, X's dtype or
//           FP16/BF16 beside an FP32 X; or of X's trailing dims in X's dtype);
//           Scale, Bias: layer_norm's (f32 [D], each optional)
//   outputs Out: X + Y, as elementwise_add writes it (X's shape and dtype;
//           the residual stream, which the next add and backward read);
//           Norm, Mean, Variance: layer_norm of Out, as layer_norm writes its
//           Y, Mean and Variance (Norm in attr out_dtype when given)
//   attrs   layer_norm's begin_norm_axis, epsilon and out_dtype
// The same bits as the two ops: each sum is rounded to X's dtype and stored,
// and the row is normalised from those stored values. What it saves is the
// layer norm's read of the sum the add has just written (on CUDA the row is
// read back from cache, runtime/ops/cuda/layer_norm_kernels.cuh). It has no
// gradient op: the pass runs after autodiff, whose layer_norm_grad and
// elementwise_add_grad read Out, Mean and Variance by name.
#include <string>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"
#include "runtime/kernels/layer_norm_row.h"
#include "runtime/ops/fused_add_layer_norm_shapes.h"
#include "runtime/ops/layer_norm_shapes.h"

namespace mix {
namespace {

using layer_norm_rules::NormDims;

void infer_fused_add_layer_norm(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  const VarDesc& y = p.var(op.in("Y"));
  add_layer_norm_rules::check_operands(op.type, x.shape, x.dtype, y.shape, y.dtype);
  const NormDims d = layer_norm_rules::norm_dims(op, x.shape);
  layer_norm_rules::check_params(p, op, d.cols);
  declare_var(p, op.out("Out"), x.shape, x.dtype);
  declare_var(p, op.out("Norm"), x.shape, layer_norm_rules::y_dtype(op, x.dtype));
  declare_var(p, op.out("Mean"), {d.rows}, DType::f32);
  declare_var(p, op.out("Variance"), {d.rows}, DType::f32);
}

void fused_add_layer_norm_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Tensor& y = ctx.in("Y");
  add_layer_norm_rules::check_operands(ctx.op.type, x.shape(), x.dtype(), y.shape(), y.dtype());
  const NormDims d = layer_norm_rules::norm_dims(ctx.op, x.shape());
  const float* scale = layer_norm_rules::param(ctx, "Scale", d.cols);
  const float* bias = layer_norm_rules::param(ctx, "Bias", d.cols);
  const float eps = ctx.attr<float>("epsilon", 1e-5f);
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  Tensor& norm = ctx.out("Norm", x.shape(), layer_norm_rules::y_dtype(ctx.op, x.dtype()));
  float* mean = ctx.out("Mean", {d.rows}, DType::f32).data<float>();
  float* var = ctx.out("Variance", {d.rows}, DType::f32).data<float>();
  // The add, as elementwise_add computes it: Y repeats every y.numel() values.
  widening::dispatch(y.dtype(), x.dtype(), [&](auto y_tag, auto x_tag) {
    using T = decltype(x_tag);
    const int64_t n = x.numel(), period = y.numel();
    for (int64_t begin = 0; period > 0 && begin < n; begin += period)
      cpu::binary(x.data<T>() + begin, y.data<decltype(y_tag)>(), out.data<T>() + begin, period, fn::Add{});
  });
  // Then layer_norm of the stored sums.
  widening::dispatch(norm.dtype(), x.dtype(), [&](auto norm_tag, auto x_tag) {
    fn::layer_norm_rows(out.data<decltype(x_tag)>(), norm.data<decltype(norm_tag)>(), d.rows, d.cols, scale, bias, eps,
                        mean, var);
  });
}

MIX_REGISTER_OP("fused_add_layer_norm", OpInfo{infer_fused_add_layer_norm, fused_add_layer_norm_cpu, {}, {}});

}  // namespace
}  // namespace mix
