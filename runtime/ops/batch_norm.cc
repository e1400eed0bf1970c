// batch_norm over X[N, C, ...] (NCHW; statistics per channel over N and the
// spatial dims), with Paddle's slots:
//   inputs  X, Scale[C], Bias[C], Mean[C], Variance[C]  (running statistics)
//           NumBatchesTracked (optional i64 scalar, PyTorch's counter)
//   outputs Y (X's shape and dtype), MeanOut, VarianceOut (the running statistics,
//           normally the same variables as Mean and Variance), SavedMean[C] and
//           SavedVariance[C] (the batch mean and 1/sqrt(var + eps), read by the grad),
//           NumBatchesTrackedOut (optional)
//   attrs   momentum (0.9: running = 0.9 running + 0.1 batch, PyTorch's momentum 0.1),
//           epsilon (1e-5), is_test (false), data_layout (NCHW, or NHWC: X is
//           [N, ..., C]; computed by permuting to NCHW and back, runtime/ops/data_format.h),
//           fuse_with_relu (false; Paddle's attr): Y = relu(batch_norm(X)), the
//           bits of batch_norm then relu. runtime/passes/fuse_bn_relu.h sets it on
//           the pairs of a training program, with its gradient: batch_norm_grad
//           with fuse_with_relu reads Bias and relu's output gradient as Y@GRAD
//           and applies relu's gradient first, its mask recomputed from X
//           (fn::BnReluGradFromX, in bulk), never writing relu's input gradient. Its Y
//           input (the forward's Y) is read only by the CUDA kernel for NCHW.
//           With fuse_with_relu, an optional input Z (X's shape and dtype)
//           makes Y = relu(round(batch_norm(X)) + Z): the bits of batch_norm
//           then fused_add_relu, which fuse_bn_relu also fuses (a residual
//           block's last batch norm). Its gradient stays the unfused ops'.
// Scale, Bias and all statistics are FP32 even when X is FP16 (docs/design.md, "Precision rules"); the
// sums run in double and Y is rounded once on store. The running variance takes
// the unbiased batch variance, as PyTorch does, so its checkpoints interchange.
// Evaluation (is_test, or an executor run with ExecEnv::training false) normalises
// with the running statistics and updates nothing.
#include <cmath>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"
#include "runtime/ops/batch_norm_shapes.h"

namespace mix {
namespace {

void infer_batch_norm(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  MIX_CHECK(is_floating(x.dtype), "batch_norm: X " << x.name << " must be a float tensor");
  const int64_t c = batch_norm_channels(x.shape, batch_norm_channels_last(op));
  for (const char* slot : {"Scale", "Bias", "Mean", "Variance"}) {
    const VarDesc& v = p.var(op.in(slot));
    MIX_CHECK(v.dtype == DType::f32 && v.shape == Shape{c},
              "batch_norm: " << slot << " " << v.name << " must be f32[" << c << "] (X " << x.name << " has " << c
                             << " channels), got " << dtype_name(v.dtype) << shape_str(v.shape));
  }
  if (!op.in_or_empty("Z").empty()) {
    const VarDesc& z = p.var(op.in("Z"));
    MIX_CHECK(op.attr<bool>("fuse_with_relu", false) && z.shape == x.shape && z.dtype == x.dtype,
              "batch_norm: a residual Z (" << z.name << ") must match X " << x.name
                                           << " and needs fuse_with_relu (runtime/passes/fuse_bn_relu.h)");
  }
  declare_var(p, op.out("Y"), x.shape, x.dtype);
  // Training writes the running statistics and what the grad reads; only a
  // batch_norm that is always in evaluation mode (is_test) may leave them out.
  const bool is_test = op.attr<bool>("is_test", false);
  for (const char* slot : {"MeanOut", "VarianceOut", "SavedMean", "SavedVariance"}) {
    MIX_CHECK(is_test || !op.out_or_empty(slot).empty(),
              "batch_norm: output " << slot << " is required in training (or set is_test)");
    if (!op.out_or_empty(slot).empty()) declare_var(p, op.out(slot), {c}, DType::f32);
  }
  if (!op.out_or_empty("NumBatchesTrackedOut").empty()) declare_var(p, op.out("NumBatchesTrackedOut"), {}, DType::i64);
}

// Calls f(row, n, c, values) for every [n, c] row of X widened to FP32 (S values each).
template <typename F>
void for_each_row(const Tensor& x, const BatchNormDims& d, std::vector<float>& buf, F&& f) {
  buf.resize(static_cast<size_t>(d.spatial));
  cpu::dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t c = 0; c < d.c; ++c) {
        const int64_t row = n * d.c + c;
        cpu::load_floats(x.data<T>() + row * d.spatial, buf.data(), d.spatial);
        f(row, c, buf.data());
      }
  });
}

// Y[row] = normalize(X[row]) with one functor per channel, then relu if
// `relu`; with a residual z (channels first, X's shape and dtype), Y[row] =
// relu(round_T(normalize(X[row])) + Z[row]) (fn::BnAddRelu, in bulk).
void normalize(const Tensor& x, const BatchNormDims& d, const std::vector<fn::BnNormalize>& per_channel, bool relu,
               const Tensor* z, Tensor& y) {
  std::vector<float> buf, zbuf(z ? static_cast<size_t>(d.spatial) : 0);
  cpu::dispatch_floating(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for_each_row(x, d, buf, [&](int64_t row, int64_t c, float* v) {
      T* out = y.data<T>() + row * d.spatial;
      if (!z) {
        const fn::BnNormalizeAct f{per_channel[static_cast<size_t>(c)], relu};
        for (int64_t i = 0; i < d.spatial; ++i) v[i] = f(v[i]);
        return cpu::store_floats(v, out, d.spatial);
      }
      // batch_norm's rounded output, through Y's row as scratch, then the add and relu.
      const fn::BnNormalize& f = per_channel[static_cast<size_t>(c)];
      for (int64_t i = 0; i < d.spatial; ++i) v[i] = f(v[i]);
      cpu::round_floats(v, out, d.spatial);
      cpu::load_floats(z->data<T>() + row * d.spatial, zbuf.data(), d.spatial);
      for (int64_t i = 0; i < d.spatial; ++i) v[i] = fn::AddRelu{}(v[i], zbuf[static_cast<size_t>(i)]);
      cpu::store_floats(v, out, d.spatial);
    });
  });
}

// X as [n, c, spatial]: X itself, or a channels-first copy of a channels-last X.
Tensor as_channels_first(const Tensor& x, const BatchNormDims& d) {
  return d.channels_last ? layout::channels_first_copy(x) : x;
}

// The output `slot`, shaped like a channels-last X, = `result` [n, c, spatial...] permuted back.
void store_channels_last(OpContext& ctx, const std::string& slot, const Tensor& result) {
  const Tensor& x = ctx.in("X");
  layout::store_channels_last(result, ctx.out(slot, x.shape(), x.dtype()));
}

// Y = normalize(X) with one functor per channel (then relu with
// fuse_with_relu, after adding Z where there is one), written in X's layout.
void write_y(OpContext& ctx, const Tensor& x_nchw, const BatchNormDims& d,
             const std::vector<fn::BnNormalize>& per_channel) {
  const Tensor& x = ctx.in("X");
  const bool relu = ctx.attr<bool>("fuse_with_relu", false);
  const Tensor* z = ctx.in_opt("Z");
  if (z) {
    MIX_CHECK(relu, "batch_norm: a residual Z needs fuse_with_relu (runtime/passes/fuse_bn_relu.h)");
    MIX_CHECK(z->shape() == x.shape() && z->dtype() == x.dtype(),
              "batch_norm: Z " << dtype_name(z->dtype()) << shape_str(z->shape()) << " must match X "
                               << dtype_name(x.dtype()) << shape_str(x.shape()));
  }
  const Tensor z_nchw = z ? as_channels_first(*z, d) : Tensor{};
  if (!d.channels_last)
    return normalize(x_nchw, d, per_channel, relu, z ? &z_nchw : nullptr, ctx.out("Y", x.shape(), x.dtype()));
  Tensor y = Tensor::empty(x_nchw.shape(), x.dtype());
  normalize(x_nchw, d, per_channel, relu, z ? &z_nchw : nullptr, y);
  store_channels_last(ctx, "Y", y);
}

void batch_norm_cpu(OpContext& ctx) {
  const BatchNormDims d = batch_norm_dims(ctx.in("X").shape(), batch_norm_channels_last(ctx.op));
  const Tensor x = as_channels_first(ctx.in("X"), d);
  const float* scale = ctx.in("Scale").data<float>();
  const float* bias = ctx.in("Bias").data<float>();
  const float eps = ctx.attr<float>("epsilon", 1e-5f);
  const bool training = ctx.env.training && !ctx.attr<bool>("is_test", false);
  std::vector<fn::BnNormalize> norm(static_cast<size_t>(d.c));

  if (!training) {
    const float* rmean = ctx.in("Mean").data<float>();
    const float* rvar = ctx.in("Variance").data<float>();
    for (int64_t c = 0; c < d.c; ++c)
      norm[static_cast<size_t>(c)] = {rmean[c], fn::bn_inv_std(rvar[c], eps) * scale[c], bias[c]};
    write_y(ctx, x, d, norm);
    return;
  }

  const int64_t m = d.n * d.spatial;  // values per channel
  MIX_CHECK(m > 1, "batch_norm: training needs more than one value per channel, X is " << shape_str(ctx.in("X").shape())
                                                                                       << " (use a larger batch)");
  std::vector<double> sum(static_cast<size_t>(d.c), 0.0), sum_sq(static_cast<size_t>(d.c), 0.0);
  std::vector<float> buf;
  for_each_row(x, d, buf, [&](int64_t, int64_t c, const float* v) {
    double s = 0, ss = 0;
    for (int64_t i = 0; i < d.spatial; ++i) {
      s += v[i];
      ss += static_cast<double>(v[i]) * v[i];
    }
    sum[static_cast<size_t>(c)] += s;
    sum_sq[static_cast<size_t>(c)] += ss;
  });
  // Read the running statistics before writing: MeanOut is normally Mean itself.
  const std::vector<float> rmean = ctx.in("Mean").to_floats(), rvar = ctx.in("Variance").to_floats();
  const float momentum = ctx.attr<float>("momentum", 0.9f);
  Tensor& saved_mean = ctx.out("SavedMean", {d.c}, DType::f32);
  Tensor& saved_inv_std = ctx.out("SavedVariance", {d.c}, DType::f32);
  Tensor& mean_out = ctx.out("MeanOut", {d.c}, DType::f32);
  Tensor& var_out = ctx.out("VarianceOut", {d.c}, DType::f32);
  for (int64_t c = 0; c < d.c; ++c) {
    const size_t k = static_cast<size_t>(c);
    const auto [mean, var] = fn::bn_batch_stats(sum[k], sum_sq[k], 0.0, m);
    const float inv_std = fn::bn_inv_std(static_cast<float>(var), eps);
    saved_mean.data<float>()[c] = static_cast<float>(mean);
    saved_inv_std.data<float>()[c] = inv_std;
    norm[k] = {static_cast<float>(mean), inv_std * scale[c], bias[c]};
    const double unbiased = fn::bn_unbiased_var(var, m);
    mean_out.data<float>()[c] = fn::bn_running_update(rmean[k], static_cast<float>(mean), momentum);
    var_out.data<float>()[c] = fn::bn_running_update(rvar[k], static_cast<float>(unbiased), momentum);
  }
  if (ctx.wants("NumBatchesTrackedOut")) {
    const int64_t seen = ctx.in("NumBatchesTracked").data<int64_t>()[0];
    ctx.out("NumBatchesTrackedOut", {}, DType::i64).data<int64_t>()[0] = seen + 1;
  }
  write_y(ctx, x, d, norm);
}

void batch_norm_grad_cpu(OpContext& ctx) {
  const BatchNormDims d = batch_norm_dims(ctx.in("X").shape(), batch_norm_channels_last(ctx.op));
  MIX_CHECK(ctx.in("Y@GRAD").shape() == ctx.in("X").shape() && ctx.in("Y@GRAD").dtype() == ctx.in("X").dtype(),
            "batch_norm_grad: Y@GRAD must match X");
  const Tensor x = as_channels_first(ctx.in("X"), d);
  const Tensor dy = as_channels_first(ctx.in("Y@GRAD"), d);
  const float* scale = ctx.in("Scale").data<float>();
  const float* mean = ctx.in("SavedMean").data<float>();
  const float* inv_std = ctx.in("SavedVariance").data<float>();
  const int64_t m = d.n * d.spatial;
  // With fuse_with_relu, dy is relu's output gradient: each value first goes
  // through relu's gradient, its mask recomputed from x with the forward's functor.
  const bool relu = ctx.attr<bool>("fuse_with_relu", false);
  std::vector<fn::BnNormalize> forward_norm;
  if (relu) {
    const float* bias = ctx.in("Bias").data<float>();
    for (int64_t c = 0; c < d.c; ++c) forward_norm.push_back({mean[c], inv_std[c] * scale[c], bias[c]});
  }
  // fn::BnReluGradFromX<T> in three bulk steps (normalise, round through T
  // with the vectorised conversions, mask): one call per element would round
  // through FP16 with the portable scalar code, slower than the whole op.
  std::vector<float> before_relu;
  Tensor rounded = relu ? Tensor::empty({d.spatial}, x.dtype()) : Tensor{};  // one row in X's dtype
  auto relu_grad = [&](auto tag, int64_t c, const float* xv, float* dyv) {
    using T = decltype(tag);
    if (!relu) return;
    const fn::BnNormalize& norm = forward_norm[static_cast<size_t>(c)];
    before_relu.resize(static_cast<size_t>(d.spatial));
    for (int64_t i = 0; i < d.spatial; ++i) before_relu[static_cast<size_t>(i)] = norm(xv[i]);
    cpu::round_floats(before_relu.data(), rounded.data<T>(), d.spatial);
    const fn::ReluBwd mask;
    for (int64_t i = 0; i < d.spatial; ++i) dyv[i] = mask(before_relu[static_cast<size_t>(i)], dyv[i]);
  };

  // Per channel: sum(dy) and sum(dy * xhat), in double.
  std::vector<double> sum_dy(static_cast<size_t>(d.c), 0.0), sum_dy_xhat(static_cast<size_t>(d.c), 0.0);
  std::vector<float> xbuf, dybuf(static_cast<size_t>(d.spatial));
  cpu::dispatch_floating(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for_each_row(x, d, xbuf, [&](int64_t row, int64_t c, const float* xv) {
      cpu::load_floats(dy.data<T>() + row * d.spatial, dybuf.data(), d.spatial);
      relu_grad(tag, c, xv, dybuf.data());
      double s = 0, sx = 0;
      for (int64_t i = 0; i < d.spatial; ++i) {
        s += dybuf[static_cast<size_t>(i)];
        sx += static_cast<double>(dybuf[static_cast<size_t>(i)]) * ((xv[i] - mean[c]) * inv_std[c]);
      }
      sum_dy[static_cast<size_t>(c)] += s;
      sum_dy_xhat[static_cast<size_t>(c)] += sx;
    });
  });
  if (ctx.wants("Scale@GRAD")) {
    float* ds = ctx.out("Scale@GRAD", {d.c}, DType::f32).data<float>();
    for (int64_t c = 0; c < d.c; ++c) ds[c] = static_cast<float>(sum_dy_xhat[static_cast<size_t>(c)]);
  }
  if (ctx.wants("Bias@GRAD")) {
    float* db = ctx.out("Bias@GRAD", {d.c}, DType::f32).data<float>();
    for (int64_t c = 0; c < d.c; ++c) db[c] = static_cast<float>(sum_dy[static_cast<size_t>(c)]);
  }
  if (!ctx.wants("X@GRAD")) return;
  Tensor dx_nchw = d.channels_last ? Tensor::empty(x.shape(), x.dtype()) : Tensor{};
  Tensor& dx = d.channels_last ? dx_nchw : ctx.out("X@GRAD", x.shape(), x.dtype());
  std::vector<fn::BnBackward> back(static_cast<size_t>(d.c));
  for (int64_t c = 0; c < d.c; ++c) {
    const size_t k = static_cast<size_t>(c);
    back[k] = {mean[c], inv_std[c], scale[c] * inv_std[c], static_cast<float>(sum_dy[k] / static_cast<double>(m)),
               static_cast<float>(sum_dy_xhat[k] / static_cast<double>(m))};
  }
  cpu::dispatch_floating(dx.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for_each_row(x, d, xbuf, [&](int64_t row, int64_t c, float* xv) {
      cpu::load_floats(dy.data<T>() + row * d.spatial, dybuf.data(), d.spatial);
      relu_grad(tag, c, xv, dybuf.data());
      const fn::BnBackward& b = back[static_cast<size_t>(c)];
      for (int64_t i = 0; i < d.spatial; ++i) xv[i] = b(xv[i], dybuf[static_cast<size_t>(i)]);
      cpu::store_floats(xv, dx.data<T>() + row * d.spatial, d.spatial);
    });
  });
  if (d.channels_last) store_channels_last(ctx, "X@GRAD", dx_nchw);
}

std::vector<OpDesc> batch_norm_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dy = g.grad_of_output(fwd.out("Y"));
  if (dy.empty()) return {};
  MIX_CHECK(fwd.in_or_empty("Z").empty(),
            "batch_norm with a residual Z has no gradient maker: runtime/passes/fuse_bn_relu.h makes it after autodiff");
  OpDesc grad = make_op("batch_norm_grad",
                        {{"X", {fwd.in("X")}},
                         {"Scale", {fwd.in("Scale")}},
                         {"SavedMean", {fwd.out("SavedMean")}},
                         {"SavedVariance", {fwd.out("SavedVariance")}},
                         {"Y@GRAD", {dy}}},
                        {{"X@GRAD", {g.grad_for_input(fwd.in("X"))}},
                         {"Scale@GRAD", {g.grad_for_input(fwd.in("Scale"))}},
                         {"Bias@GRAD", {g.grad_for_input(fwd.in("Bias"))}}},
                        fwd.attrs);
  if (fwd.attr<bool>("fuse_with_relu", false)) {  // relu's mask is recomputed from X with Bias
    grad.inputs["Bias"] = {fwd.in("Bias")};
    grad.inputs["Y"] = {fwd.out("Y")};
  }
  return {grad};
}

MIX_REGISTER_OP("batch_norm", OpInfo{infer_batch_norm, batch_norm_cpu, {}, batch_norm_grad_maker});
MIX_REGISTER_OP("batch_norm_grad", OpInfo{{}, batch_norm_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
