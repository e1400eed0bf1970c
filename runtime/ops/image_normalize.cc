// image_normalize: torchvision's ToTensor then Normalize of a batch of 8-bit
// pixels, Out = (X / 255 - mean[c]) / std[c] (fn::NormalizePixel), written in
// the layout and dtype the model's first op reads. The image readers hand
// over u8 NHWC batches (a quarter of FP32's bytes to upload) and the model
// starts with this op, so on a GPU the normalisation runs on the device,
// fused with the transpose to channels first and with the cast to FP16/BF16.
//   input   X, u8 [N, H, W, C] (1 to 4 channels)
//   attrs   mean, std (vector<double>, one per channel, on [0, 1] pixels);
//           data_format "NCHW" (default; Out [N, C, H, W]) or "NHWC" (Out
//           [N, H, W, C]); out_dtype "f32" (default), "f16" or "bf16": each
//           value computed in FP32 and rounded once on store, so an FP16 Out
//           has the bits of an FP32 Out cast to FP16
//   output  Out
// It reads data, so no gradient flows through it (and none is asked for:
// nothing before it depends on a parameter). It is in no AMP list, so
// amp::rewrite keeps it FP32 and casts Out for the white conv2d after it;
// amp::fold_casts_into_producers then has it store the cast's dtype itself.
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/ops/image_normalize_attrs.h"

namespace mix {
namespace {

namespace rules = image_normalize_rules;

void infer_image_normalize(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  const rules::Params params = rules::params(op, x.dtype, x.shape);
  const std::string out = op.out("Out");
  declare_var(p, out, rules::out_shape(x.shape, params.channels_last), params.out_dtype);
  p.var(out).stop_gradient = true;  // normalised data, as the pixels it is made of
}

// The reference: every pixel's channels in X's order, each value written
// where the output layout puts it.
template <typename T>
void normalize_batch(const uint8_t* x, T* out, const rules::Params& p, int64_t images, int64_t pixels) {
  const int64_t channels = p.channels;
  for (int64_t n = 0; n < images; ++n)
    for (int64_t i = 0; i < pixels; ++i)  // i = h * W + w
      for (int64_t c = 0; c < channels; ++c) {
        const int64_t from = (n * pixels + i) * channels + c;
        const int64_t to = p.channels_last ? from : (n * channels + c) * pixels + i;
        out[to] = from_float<T>(p.per_channel[c](x[from]));
      }
}

void image_normalize_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const rules::Params p = rules::params(ctx.op, x.dtype(), x.shape());
  Tensor& out = ctx.out("Out", rules::out_shape(x.shape(), p.channels_last), p.out_dtype);
  cpu::dispatch_floating(p.out_dtype, [&](auto tag) {
    using T = decltype(tag);
    normalize_batch(x.data<uint8_t>(), out.data<T>(), p, x.dim(0), x.dim(1) * x.dim(2));
  });
}

MIX_REGISTER_OP("image_normalize", OpInfo{infer_image_normalize, image_normalize_cpu, {}, {}});

}  // namespace
}  // namespace mix
