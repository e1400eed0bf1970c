// layer_norm over the trailing dims, with Paddle's slots:
//   inputs  X [..., D...] (f32, f16 or bf16), Scale [D] and Bias [D] (f32, each optional)
//   outputs Y (X's shape and dtype, or attr out_dtype's), Mean [rows] and
//           Variance [rows] (f32; the grad reads them, so a program that
//           differentiates needs both)
//   attrs   begin_norm_axis (int64, default 1; negative counts from the end):
//           each row is X's dims [begin_norm_axis, ndim) flattened (D values),
//           rows = the product of the leading dims; epsilon (default 1e-5);
//           out_dtype (optional): f16 or bf16 for an f32 X, set by
//           amp::fold_casts_into_producers where AMP cast Y for a white op:
//           Y is then rounded once, on store, to the cast's bits, and no FP32
//           copy is written and read back
// y = (x - mean) / sqrt(var + eps) * scale + bias per row, var biased (divided
// by D) and stored as such, as Paddle does (PyTorch stores 1/std instead).
// Scale, Bias and the statistics stay FP32 when X is FP16 (docs/design.md, "Precision rules"): the row
// sums run in double and Y is rounded once on store. Row math in
// runtime/kernels/layer_norm_row.h.
//
// Grad (layer_norm_grad): inputs X, Scale (when the forward has one), Mean,
// Variance, Y@GRAD (Y's dtype: an f16 Y's gradient is widened on load, as the
// removed cast's FP32 gradient was exact), and optionally Accumulate (X's
// shape and dtype: the other part of X's gradient, the residual stream's,
// added to dX as `sum` would add it, fn::add_grad_part; set by
// runtime/passes/fold_grad_sums.h); outputs X@GRAD (X's dtype),
// Scale@GRAD and Bias@GRAD (f32), each only when wanted. With xhat = (x - mean) inv_std and g = dy * scale:
//   dX = inv_std * (g - mean_row(g) - xhat * mean_row(g * xhat))
//   Scale@GRAD = sum over rows of dy * xhat,   Bias@GRAD = sum over rows of dy
// (the column sums in double).
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/layer_norm_row.h"
#include "runtime/ops/accumulate_input.h"
#include "runtime/ops/layer_norm_shapes.h"

namespace mix {
namespace {

using layer_norm_rules::norm_dims;
using layer_norm_rules::NormDims;
using layer_norm_rules::param;

void infer_layer_norm(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  MIX_CHECK(is_floating(x.dtype), "layer_norm: X " << x.name << " must be a float tensor, got " << dtype_name(x.dtype));
  const NormDims d = norm_dims(op, x.shape);
  layer_norm_rules::check_params(p, op, d.cols);
  declare_var(p, op.out("Y"), x.shape, layer_norm_rules::y_dtype(op, x.dtype));
  for (const char* slot : {"Mean", "Variance"})
    if (!op.out_or_empty(slot).empty()) declare_var(p, op.out(slot), {d.rows}, DType::f32);
}

void layer_norm_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const NormDims d = norm_dims(ctx.op, x.shape());
  const float* scale = param(ctx, "Scale", d.cols);
  const float* bias = param(ctx, "Bias", d.cols);
  const float eps = ctx.attr<float>("epsilon", 1e-5f);
  Tensor& y = ctx.out("Y", x.shape(), layer_norm_rules::y_dtype(ctx.op, x.dtype()));
  std::vector<float> mean_tmp, var_tmp;
  auto stats = [&](const char* slot, std::vector<float>& tmp) {
    if (ctx.wants(slot)) return ctx.out(slot, {d.rows}, DType::f32).data<float>();
    tmp.resize(static_cast<size_t>(d.rows));
    return tmp.data();
  };
  float* mean = stats("Mean", mean_tmp);
  float* var = stats("Variance", var_tmp);
  widening::dispatch(y.dtype(), x.dtype(), [&](auto y_tag, auto x_tag) {
    fn::layer_norm_rows(x.data<decltype(x_tag)>(), y.data<decltype(y_tag)>(), d.rows, d.cols, scale, bias, eps, mean,
                        var);
  });
}

void layer_norm_grad_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Tensor& dy = ctx.in("Y@GRAD");
  layer_norm_rules::check_grad_input(x, dy);
  const NormDims d = norm_dims(ctx.op, x.shape());
  const float* scale = param(ctx, "Scale", d.cols);
  const Tensor& mean_t = ctx.in("Mean");
  const Tensor& var_t = ctx.in("Variance");
  layer_norm_rules::check_stats(mean_t, var_t, d.rows);
  const float* mean = mean_t.data<float>();
  const float* var = var_t.data<float>();
  const float eps = ctx.attr<float>("epsilon", 1e-5f);
  const bool want_scale = ctx.wants("Scale@GRAD"), want_bias = ctx.wants("Bias@GRAD");
  MIX_CHECK(!want_scale || scale, "layer_norm_grad: Scale@GRAD is wanted but the op has no Scale");
  std::vector<double> dscale(want_scale ? static_cast<size_t>(d.cols) : 0),
      dbias(want_bias ? static_cast<size_t>(d.cols) : 0);
  const Tensor* acc = grad_part::accumulate(ctx, "X@GRAD", x.shape(), x.dtype(), false);
  MIX_CHECK(!acc || ctx.wants("X@GRAD"), "layer_norm_grad: Accumulate is given but X@GRAD is not wanted");
  Tensor* dx = ctx.wants("X@GRAD") ? &ctx.out("X@GRAD", x.shape(), x.dtype()) : nullptr;
  widening::dispatch(dy.dtype(), x.dtype(), [&](auto dy_tag, auto x_tag) {
    using T = decltype(x_tag);
    using TDY = decltype(dy_tag);
    for (int64_t r = 0; r < d.rows; ++r) {
      const T* xr = x.data<T>() + r * d.cols;
      const TDY* dyr = dy.data<TDY>() + r * d.cols;
      if (dx)
        fn::layer_norm_grad_row(xr, dyr, dx->data<T>() + r * d.cols, d.cols, scale, mean[r], var[r], eps,
                                acc ? acc->data<T>() + r * d.cols : nullptr);
      if (!want_scale && !want_bias) continue;
      const float inv_std = fn::ln_inv_std(var[r], eps);
      for (int64_t j = 0; j < d.cols; ++j) {
        const float g = to_float(dyr[j]);
        const size_t k = static_cast<size_t>(j);
        if (want_bias) dbias[k] += g;
        if (want_scale) dscale[k] += static_cast<double>(g) * fn::ln_xhat(to_float(xr[j]), mean[r], inv_std);
      }
    }
  });
  auto store = [&](const char* slot, const std::vector<double>& sums) {
    float* out = ctx.out(slot, {d.cols}, DType::f32).data<float>();
    for (size_t k = 0; k < sums.size(); ++k) out[k] = static_cast<float>(sums[k]);
  };
  if (want_scale) store("Scale@GRAD", dscale);
  if (want_bias) store("Bias@GRAD", dbias);
}

std::vector<OpDesc> layer_norm_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dy = g.grad_of_output(fwd.out("Y"));
  if (dy.empty()) return {};
  const std::string scale = fwd.in_or_empty("Scale"), bias = fwd.in_or_empty("Bias");
  const std::string dx = g.grad_for_input(fwd.in("X"));
  const std::string ds = scale.empty() ? std::string() : g.grad_for_input(scale);
  const std::string db = bias.empty() ? std::string() : g.grad_for_input(bias);
  if (dx.empty() && ds.empty() && db.empty()) return {};
  MIX_CHECK(!fwd.out_or_empty("Mean").empty() && !fwd.out_or_empty("Variance").empty(),
            "layer_norm: outputs Mean and Variance are needed for the gradient (of " << fwd.out("Y") << ")");
  std::map<std::string, std::vector<std::string>> ins{
      {"X", {fwd.in("X")}}, {"Mean", {fwd.out("Mean")}}, {"Variance", {fwd.out("Variance")}}, {"Y@GRAD", {dy}}};
  if (!scale.empty()) ins["Scale"] = {scale};
  std::map<std::string, std::vector<std::string>> outs;
  if (!dx.empty()) outs["X@GRAD"] = {dx};
  if (!ds.empty()) outs["Scale@GRAD"] = {ds};
  if (!db.empty()) outs["Bias@GRAD"] = {db};
  return {make_op("layer_norm_grad", ins, outs, fwd.attrs)};
}

MIX_REGISTER_OP("layer_norm", OpInfo{infer_layer_norm, layer_norm_cpu, {}, layer_norm_grad_maker});
MIX_REGISTER_OP("layer_norm_grad", OpInfo{{}, layer_norm_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
