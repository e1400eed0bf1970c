// conv2d: Output[N, OC, OH, OW] = Input[N, C, H, W] * Filter[OC, C/groups, KH, KW]
// (cross-correlation, as PyTorch's nn.Conv2d and Paddle's conv2d), with
// strides, paddings, dilations and groups (runtime/ops/conv_shapes.h). No bias:
// models add one with elementwise_add, and ResNet has none.
//
// CPU kernel: im2col + OpenBLAS SGEMM. A chunk of images is unfolded into
// col[(c/groups) kh kw, chunk oh ow], so one GEMM per group covers the chunk:
//     Output_g[oc/groups, chunk oh ow] = Filter_g[oc/groups, K] . col
// FP16/BF16 data is widened to FP32, multiplied with FP32 accumulation and
// rounded once on store, as a tensor-core convolution does. The gradients:
//     Filter@GRAD_g += Output@GRAD_g . col^T    (accumulated in FP32 over the whole batch)
//     col@GRAD       = Filter_g^T . Output@GRAD_g, folded back by col2im (summing overlaps)
// Workspaces come from the caching allocator, so the allocator's peak counts them.
// data_format NHWC (channels last) permutes Input and Output@GRAD to NCHW,
// runs the same loops and permutes the results back (runtime/ops/data_format.h).
#include <algorithm>
#include <cstring>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/ops/conv_shapes.h"
#include "runtime/ops/gemm.h"

namespace mix {
namespace {

// Floats of im2col matrix per chunk: large enough for efficient GEMMs, small
// enough that the workspace stays a fraction of the activations (16 MiB).
constexpr int64_t kColBudgetFloats = int64_t{4} << 20;

void infer_conv2d(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("Input"));
  const VarDesc& f = p.var(op.in("Filter"));
  MIX_CHECK(x.dtype == f.dtype, "conv2d: Input " << x.name << " is " << dtype_name(x.dtype) << " but Filter " << f.name
                                                 << " is " << dtype_name(f.dtype) << " (amp::rewrite inserts casts)");
  MIX_CHECK(is_floating(x.dtype), "conv2d: Input " << x.name << " must be a float tensor");
  declare_var(p, op.out("Output"), conv_dims(op, x.shape, f.shape).out_shape(), x.dtype);
}

// dst[0, count) = float(t's elements [offset, offset + count)).
void widen(const Tensor& t, int64_t offset, int64_t count, float* dst) {
  cpu::dispatch_floating(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::load_floats(t.data<T>() + offset, dst, count);
  });
}

// The output columns ox whose input column ox * stride - pad + j * dil lies in
// [0, w): [lo, hi). Precomputing it keeps the bounds test out of the inner loops.
struct ColumnRange {
  int64_t lo, hi;
};
ColumnRange valid_columns(const ConvDims& d, int64_t j) {
  const int64_t offset = j * d.dil_w - d.pad_w;  // ix = ox * stride + offset
  // Smallest ox with ix >= 0, and one past the largest with ix < w.
  const int64_t lo = offset >= 0 ? 0 : (-offset + d.stride_w - 1) / d.stride_w;
  const int64_t hi = d.w - offset <= 0 ? 0 : (d.w - offset - 1) / d.stride_w + 1;
  return {std::min(lo, d.ow), std::clamp<int64_t>(hi, std::min(lo, d.ow), d.ow)};
}

// Unfolds channels [c0, c0 + c/groups) of `nb` images x[nb, c, h, w] into
// col[k, nb * oh * ow], row k = (ci kh + i) kw + j; padding reads as 0.
void im2col(const float* x, const ConvDims& d, int64_t nb, int64_t c0, float* col) {
  const int64_t ohw = d.oh * d.ow, cols = nb * ohw;
  for (int64_t ci = 0; ci < d.c_per_group(); ++ci)
    for (int64_t i = 0; i < d.kh; ++i)
      for (int64_t j = 0; j < d.kw; ++j) {
        float* row = col + ((ci * d.kh + i) * d.kw + j) * cols;
        const ColumnRange r = valid_columns(d, j);
        const int64_t offset = j * d.dil_w - d.pad_w;
        for (int64_t img = 0; img < nb; ++img) {
          const float* plane = x + (img * d.c + c0 + ci) * d.h * d.w;
          for (int64_t oy = 0; oy < d.oh; ++oy) {
            float* dst = row + img * ohw + oy * d.ow;
            const int64_t iy = oy * d.stride_h - d.pad_h + i * d.dil_h;
            if (iy < 0 || iy >= d.h) {
              std::fill(dst, dst + d.ow, 0.f);
              continue;
            }
            // Input column of output column r.lo (>= 0); the next ones follow at the stride.
            const float* src = plane + iy * d.w + (r.lo * d.stride_w + offset);
            std::fill(dst, dst + r.lo, 0.f);
            if (d.stride_w == 1) {
              std::memcpy(dst + r.lo, src, static_cast<size_t>(r.hi - r.lo) * sizeof(float));
            } else {
              for (int64_t ox = r.lo; ox < r.hi; ++ox) dst[ox] = src[(ox - r.lo) * d.stride_w];
            }
            std::fill(dst + r.hi, dst + d.ow, 0.f);
          }
        }
      }
}

// The adjoint of im2col: adds col's entries back into dx[nb, c, h, w] (channels c0..).
void col2im_add(const float* col, const ConvDims& d, int64_t nb, int64_t c0, float* dx) {
  const int64_t ohw = d.oh * d.ow, cols = nb * ohw;
  for (int64_t ci = 0; ci < d.c_per_group(); ++ci)
    for (int64_t i = 0; i < d.kh; ++i)
      for (int64_t j = 0; j < d.kw; ++j) {
        const float* row = col + ((ci * d.kh + i) * d.kw + j) * cols;
        const ColumnRange r = valid_columns(d, j);
        const int64_t offset = j * d.dil_w - d.pad_w;
        for (int64_t img = 0; img < nb; ++img) {
          float* plane = dx + (img * d.c + c0 + ci) * d.h * d.w;
          for (int64_t oy = 0; oy < d.oh; ++oy) {
            const int64_t iy = oy * d.stride_h - d.pad_h + i * d.dil_h;
            if (iy < 0 || iy >= d.h) continue;
            const float* src = row + img * ohw + oy * d.ow;
            float* dst = plane + iy * d.w + (r.lo * d.stride_w + offset);
            for (int64_t ox = r.lo; ox < r.hi; ++ox) dst[(ox - r.lo) * d.stride_w] += src[ox];
          }
        }
      }
}

// Images per chunk so that the im2col matrix stays within kColBudgetFloats.
int64_t chunk_images(const ConvDims& d) {
  const int64_t per_image = std::max<int64_t>(1, d.k_per_group() * d.oh * d.ow);
  return std::clamp<int64_t>(kColBudgetFloats / per_image, 1, std::max<int64_t>(d.n, 1));
}

Tensor f32_workspace(int64_t floats) { return Tensor::empty({std::max<int64_t>(floats, 1)}, DType::f32); }

// The chunk's input as FP32: the tensor's own data for f32, else a widened copy in `buf`.
const float* chunk_input(const Tensor& x, const ConvDims& d, int64_t n0, int64_t nb, Tensor& buf) {
  const int64_t per_image = d.c * d.h * d.w;
  if (x.dtype() == DType::f32) return x.data<float>() + n0 * per_image;
  if (!buf.defined() || buf.numel() < nb * per_image) buf = f32_workspace(nb * per_image);
  widen(x, n0 * per_image, nb * per_image, buf.data<float>());
  return buf.data<float>();
}

// out[n, oc, oh, ow] = conv(x[n, c, h, w], filter): the channels-first forward.
void conv2d_nchw(const Tensor& x, const Tensor& filter, const ConvDims& d, Tensor& out) {
  if (d.n == 0) return;
  const int64_t ohw = d.oh * d.ow, K = d.k_per_group(), ocg = d.oc_per_group();
  const int64_t nb_max = chunk_images(d);
  const float* w = cpu::as_f32(filter, 1);  // [oc, K]
  Tensor xbuf, col = f32_workspace(K * nb_max * ohw), acc = f32_workspace(ocg * nb_max * ohw);
  for (int64_t n0 = 0; n0 < d.n; n0 += nb_max) {
    const int64_t nb = std::min(nb_max, d.n - n0), cols = nb * ohw;
    const float* xs = chunk_input(x, d, n0, nb, xbuf);
    for (int64_t g = 0; g < d.groups; ++g) {
      im2col(xs, d, nb, g * d.c_per_group(), col.data<float>());
      cpu::sgemm(false, false, ocg, cols, K, 1.f, w + g * ocg * K, col.data<float>(), 0.f, acc.data<float>());
      cpu::dispatch_floating(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        for (int64_t img = 0; img < nb; ++img)
          for (int64_t oc = 0; oc < ocg; ++oc)
            cpu::store_floats(acc.data<float>() + oc * cols + img * ohw,
                              out.data<T>() + ((n0 + img) * d.oc + g * ocg + oc) * ohw, ohw);
      });
    }
  }
}

void conv2d_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("Input");
  const Tensor& filter = ctx.in("Filter");
  MIX_CHECK(x.dtype() == filter.dtype(), "conv2d: Input and Filter dtypes differ");
  const ConvDims d = conv_dims(ctx.op, x.shape(), filter.shape());
  if (!d.channels_last) return conv2d_nchw(x, filter, d, ctx.out("Output", d.out_shape(), x.dtype()));
  Tensor out = Tensor::empty(d.out_shape_nchw(), x.dtype());
  conv2d_nchw(layout::channels_first_copy(x), filter, d, out);
  layout::store_channels_last(out, ctx.out("Output", d.out_shape(), x.dtype()));
}

// The channels-first gradients: dx[n, c, h, w] and dw (either may be null) from dout[n, oc, oh, ow].
void conv2d_grad_nchw(const Tensor& x, const Tensor& filter, const Tensor& dout, const ConvDims& d, Tensor* dx,
                      Tensor* dw) {
  const bool want_dx = dx != nullptr, want_dw = dw != nullptr;
  const int64_t ohw = d.oh * d.ow, K = d.k_per_group(), ocg = d.oc_per_group(), per_image = d.c * d.h * d.w;
  const int64_t nb_max = chunk_images(d);
  const float* w = want_dx ? cpu::as_f32(filter, 1) : nullptr;  // only dX reads the filter
  Tensor xbuf, col = f32_workspace(K * nb_max * ohw), dout32 = f32_workspace(ocg * nb_max * ohw);
  Tensor dw32 = want_dw ? Tensor::zeros({d.oc * K}, DType::f32) : Tensor{};
  Tensor dx32 = want_dx ? f32_workspace(nb_max * per_image) : Tensor{};
  for (int64_t n0 = 0; n0 < d.n; n0 += nb_max) {
    const int64_t nb = std::min(nb_max, d.n - n0), cols = nb * ohw;
    const float* xs = want_dw ? chunk_input(x, d, n0, nb, xbuf) : nullptr;
    if (want_dx) std::fill(dx32.data<float>(), dx32.data<float>() + nb * per_image, 0.f);
    for (int64_t g = 0; g < d.groups; ++g) {
      // Output@GRAD of this group and chunk as [oc/groups, nb oh ow], the GEMM layout.
      for (int64_t img = 0; img < nb; ++img)
        for (int64_t oc = 0; oc < ocg; ++oc)
          widen(dout, ((n0 + img) * d.oc + g * ocg + oc) * ohw, ohw, dout32.data<float>() + oc * cols + img * ohw);
      if (want_dw) {
        im2col(xs, d, nb, g * d.c_per_group(), col.data<float>());
        cpu::sgemm(false, true, ocg, K, cols, 1.f, dout32.data<float>(), col.data<float>(), 1.f,
                   dw32.data<float>() + g * ocg * K);
      }
      if (want_dx) {
        cpu::sgemm(true, false, K, cols, ocg, 1.f, w + g * ocg * K, dout32.data<float>(), 0.f, col.data<float>());
        col2im_add(col.data<float>(), d, nb, g * d.c_per_group(), dx32.data<float>());
      }
    }
    if (want_dx)
      cpu::dispatch_floating(dx->dtype(), [&](auto tag) {
        using T = decltype(tag);
        cpu::store_floats(dx32.data<float>(), dx->data<T>() + n0 * per_image, nb * per_image);
      });
  }
  if (want_dw) cpu::store_f32(dw32.data<float>(), *dw);
}

void conv2d_grad_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("Input");
  const Tensor& filter = ctx.in("Filter");
  const Tensor& dout = ctx.in("Output@GRAD");
  const ConvDims d = conv_dims(ctx.op, x.shape(), filter.shape());
  MIX_CHECK(dout.shape() == d.out_shape(),
            "conv2d_grad: Output@GRAD is " << shape_str(dout.shape()) << ", expected " << shape_str(d.out_shape()));
  MIX_CHECK(filter.dtype() == x.dtype() && dout.dtype() == x.dtype(),
            "conv2d_grad: Input, Filter and Output@GRAD must share a dtype, got "
                << dtype_name(x.dtype()) << ", " << dtype_name(filter.dtype()) << ", " << dtype_name(dout.dtype()));
  Tensor* dw = ctx.wants("Filter@GRAD") ? &ctx.out("Filter@GRAD", filter.shape(), filter.dtype()) : nullptr;
  if (!d.channels_last) {
    Tensor* dx = ctx.wants("Input@GRAD") ? &ctx.out("Input@GRAD", x.shape(), x.dtype()) : nullptr;
    return conv2d_grad_nchw(x, filter, dout, d, dx, dw);
  }
  Tensor dx_nchw =
      ctx.wants("Input@GRAD") ? Tensor::empty(layout::channels_first_shape(x.shape()), x.dtype()) : Tensor{};
  conv2d_grad_nchw(layout::channels_first_copy(x), filter, layout::channels_first_copy(dout), d,
                   dx_nchw.defined() ? &dx_nchw : nullptr, dw);
  if (dx_nchw.defined()) layout::store_channels_last(dx_nchw, ctx.out("Input@GRAD", x.shape(), x.dtype()));
}

std::vector<OpDesc> conv2d_grad_maker(const OpDesc& fwd, GradContext& g) {
  return {make_op("conv2d_grad",
                  {{"Input", {fwd.in("Input")}},
                   {"Filter", {fwd.in("Filter")}},
                   {"Output@GRAD", {g.grad_of_output(fwd.out("Output"))}}},
                  {{"Input@GRAD", {g.grad_for_input(fwd.in("Input"))}},
                   {"Filter@GRAD", {g.grad_for_input(fwd.in("Filter"))}}},
                  fwd.attrs)};
}

MIX_REGISTER_OP("conv2d", OpInfo{infer_conv2d, conv2d_cpu, {}, conv2d_grad_maker});
MIX_REGISTER_OP("conv2d_grad", OpInfo{{}, conv2d_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
