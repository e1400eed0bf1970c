// pool2d over X[N, C, H, W]: max or average pooling of kh x kw windows
// (ksize, strides, paddings), or global pooling over the whole plane
// (global_pooling, ResNet's head). Shape rules in runtime/ops/conv_shapes.h.
//   max: padding never wins (it is -inf); the gradient goes to the first
//        maximum of each window in row-major order, as PyTorch's does, found
//        again from X by the grad op rather than stored as indices.
//   avg: the window's sum over its in-bounds count (exclusive, Paddle's
//        default) or over kh kw (exclusive=false, PyTorch's count_include_pad).
// Each plane is widened to FP32, pooled, and rounded once on store.
// data_format NHWC (channels last) permutes X and Out@GRAD to NCHW, runs the
// same loops and permutes the results back (runtime/ops/data_format.h).
#include <cmath>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/ops/conv_shapes.h"

namespace mix {
namespace {

void infer_pool2d(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  MIX_CHECK(is_floating(x.dtype), "pool2d: X " << x.name << " must be a float tensor");
  declare_var(p, op.out("Out"), pool_dims(op, x.shape).out_shape(), x.dtype);
}

// The in-bounds part of the window of output (oy, ox): rows [y0, y1), columns [x0, x1).
struct Window {
  int64_t y0, y1, x0, x1;
};
Window window_at(const PoolDims& d, int64_t oy, int64_t ox) {
  const int64_t ys = oy * d.stride_h - d.pad_h, xs = ox * d.stride_w - d.pad_w;
  return {std::max<int64_t>(ys, 0), std::min(ys + d.kh, d.h), std::max<int64_t>(xs, 0), std::min(xs + d.kw, d.w)};
}

// Row-major index (in the plane) of the window's first maximum; a NaN wins, so it propagates.
int64_t argmax_in(const float* plane, const PoolDims& d, const Window& w) {
  int64_t best = -1;
  float best_value = 0.f;
  for (int64_t y = w.y0; y < w.y1; ++y)
    for (int64_t x = w.x0; x < w.x1; ++x) {
      const float v = plane[y * d.w + x];
      if (best < 0 || v > best_value || (std::isnan(v) && !std::isnan(best_value))) {
        best = y * d.w + x;
        best_value = v;
      }
    }
  return best;
}

float avg_divisor(const PoolDims& d, const Window& w) {
  return d.exclusive ? static_cast<float>((w.y1 - w.y0) * (w.x1 - w.x0)) : static_cast<float>(d.kh * d.kw);
}

// out[n, c, oh, ow] = pool(x[n, c, h, w]): the channels-first forward.
void pool2d_nchw(const Tensor& x, const PoolDims& d, Tensor& out) {
  std::vector<float> plane(static_cast<size_t>(d.h * d.w)), res(static_cast<size_t>(d.oh * d.ow));
  cpu::dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (int64_t nc = 0; nc < d.n * d.c; ++nc) {
      cpu::load_floats(x.data<T>() + nc * d.h * d.w, plane.data(), d.h * d.w);
      for (int64_t oy = 0; oy < d.oh; ++oy)
        for (int64_t ox = 0; ox < d.ow; ++ox) {
          const Window w = window_at(d, oy, ox);
          float r;
          if (d.is_max) {
            r = plane[static_cast<size_t>(argmax_in(plane.data(), d, w))];
          } else {
            double s = 0;
            for (int64_t y = w.y0; y < w.y1; ++y)
              for (int64_t xx = w.x0; xx < w.x1; ++xx) s += plane[static_cast<size_t>(y * d.w + xx)];
            r = static_cast<float>(s / avg_divisor(d, w));
          }
          res[static_cast<size_t>(oy * d.ow + ox)] = r;
        }
      cpu::store_floats(res.data(), out.data<T>() + nc * d.oh * d.ow, d.oh * d.ow);
    }
  });
}

void pool2d_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const PoolDims d = pool_dims(ctx.op, x.shape());
  if (!d.channels_last) return pool2d_nchw(x, d, ctx.out("Out", d.out_shape(), x.dtype()));
  Tensor out = Tensor::empty(d.out_shape_nchw(), x.dtype());
  pool2d_nchw(layout::channels_first_copy(x), d, out);
  layout::store_channels_last(out, ctx.out("Out", d.out_shape(), x.dtype()));
}

// dx[n, c, h, w] from dout[n, c, oh, ow]: the channels-first gradient.
void pool2d_grad_nchw(const Tensor& x, const Tensor& dout, const PoolDims& d, Tensor& dx) {
  std::vector<float> plane(static_cast<size_t>(d.h * d.w)), dplane(plane.size()), dres(static_cast<size_t>(d.oh * d.ow));
  cpu::dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (int64_t nc = 0; nc < d.n * d.c; ++nc) {
      if (d.is_max) cpu::load_floats(x.data<T>() + nc * d.h * d.w, plane.data(), d.h * d.w);
      cpu::load_floats(dout.data<T>() + nc * d.oh * d.ow, dres.data(), d.oh * d.ow);
      std::fill(dplane.begin(), dplane.end(), 0.f);
      for (int64_t oy = 0; oy < d.oh; ++oy)
        for (int64_t ox = 0; ox < d.ow; ++ox) {
          const Window w = window_at(d, oy, ox);
          const float g = dres[static_cast<size_t>(oy * d.ow + ox)];
          if (d.is_max) {
            dplane[static_cast<size_t>(argmax_in(plane.data(), d, w))] += g;
          } else {
            const float share = g / avg_divisor(d, w);
            for (int64_t y = w.y0; y < w.y1; ++y)
              for (int64_t xx = w.x0; xx < w.x1; ++xx) dplane[static_cast<size_t>(y * d.w + xx)] += share;
          }
        }
      cpu::store_floats(dplane.data(), dx.data<T>() + nc * d.h * d.w, d.h * d.w);
    }
  });
}

void pool2d_grad_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Tensor& dout = ctx.in("Out@GRAD");
  const PoolDims d = pool_dims(ctx.op, x.shape());
  MIX_CHECK(dout.shape() == d.out_shape(),
            "pool2d_grad: Out@GRAD is " << shape_str(dout.shape()) << ", expected " << shape_str(d.out_shape()));
  if (!d.channels_last) return pool2d_grad_nchw(x, dout, d, ctx.out("X@GRAD", x.shape(), x.dtype()));
  Tensor dx = Tensor::empty(layout::channels_first_shape(x.shape()), x.dtype());
  pool2d_grad_nchw(layout::channels_first_copy(x), layout::channels_first_copy(dout), d, dx);
  layout::store_channels_last(dx, ctx.out("X@GRAD", x.shape(), x.dtype()));
}

std::vector<OpDesc> pool2d_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dx = g.grad_for_input(fwd.in("X"));
  if (dx.empty()) return {};
  return {make_op("pool2d_grad", {{"X", {fwd.in("X")}}, {"Out@GRAD", {g.grad_of_output(fwd.out("Out"))}}},
                  {{"X@GRAD", {dx}}}, fwd.attrs)};
}

MIX_REGISTER_OP("pool2d", OpInfo{infer_pool2d, pool2d_cpu, {}, pool2d_grad_maker});
MIX_REGISTER_OP("pool2d_grad", OpInfo{{}, pool2d_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
