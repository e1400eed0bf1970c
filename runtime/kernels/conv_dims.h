#pragma once
// The dimensions of one convolution or pooling, as plain structs: what the
// CPU kernels, the cuDNN helpers (runtime/cuda/) and the ops' shape rules
// (runtime/ops/conv_shapes.h, which reads them from an op's attributes) all
// take. The dims are always named n, c, h, w whatever the layout;
// out_shape() is in the op's layout.
#include <cstdint>
#include <sstream>
#include <string>

#include "runtime/core/dtype.h"
#include "runtime/core/tensor.h"

namespace mix {

/// An image tensor's [n, c, h, w] in the op's layout: [N, C, H, W], or [N, H, W, C] channels last.
inline Shape image_shape(bool channels_last, int64_t n, int64_t c, int64_t h, int64_t w) {
  return channels_last ? Shape{n, h, w, c} : Shape{n, c, h, w};
}

/// The three products of a convolution: Output from Input and Filter, and
/// the gradients of Input and of Filter from Output's gradient (conv2d_grad).
enum class ConvPass : int64_t { forward, backward_data, backward_filter };

/// "forward", "backward data", "backward filter": a pass as messages name it.
inline const char* conv_pass_name(ConvPass p) {
  switch (p) {
    case ConvPass::forward:
      return "forward";
    case ConvPass::backward_data:
      return "backward data";
    case ConvPass::backward_filter:
      return "backward filter";
  }
  return "?";
}

/// Output extent of a sliding window: floor((in + 2 pad - dil (k - 1) - 1) / stride) + 1.
inline int64_t window_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
  return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

struct ConvDims {
  int64_t n, c, h, w;          // input [n, c, h, w]
  int64_t oc, kh, kw;          // filter [oc, c / groups, kh, kw]
  int64_t oh, ow;              // output [n, oc, oh, ow]
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups;
  bool channels_last;          // data_format NHWC: Input and Output are [n, h, w, c]
  int64_t c_per_group() const { return c / groups; }
  int64_t oc_per_group() const { return oc / groups; }
  /// Rows of the im2col matrix of one group: (c / groups) kh kw.
  int64_t k_per_group() const { return c_per_group() * kh * kw; }
  Shape out_shape() const { return image_shape(channels_last, n, oc, oh, ow); }
  Shape out_shape_nchw() const { return {n, oc, oh, ow}; }
};

/// "f16 Input [n, c, h, w] channels last (NHWC), Filter [oc, c/g, kh, kw],
/// groups g": a convolution's shapes as errors and warnings name them.
inline std::string conv_shape_text(DType t, const ConvDims& d) {
  std::ostringstream o;
  o << dtype_name(t) << " Input [" << d.n << ", " << d.c << ", " << d.h << ", " << d.w << "]"
    << (d.channels_last ? " channels last (NHWC)" : "") << ", Filter [" << d.oc << ", " << d.c_per_group() << ", "
    << d.kh << ", " << d.kw << "], groups " << d.groups;
  return o.str();
}

struct PoolDims {
  int64_t n, c, h, w;
  int64_t kh, kw, stride_h, stride_w, pad_h, pad_w;
  int64_t oh, ow;
  bool is_max;     // pooling_type "max", else "avg"
  bool exclusive;  // avg: divide by the window's in-bounds count (Paddle's default), else by kh kw
  bool channels_last;  // data_format NHWC: X and Out are [n, h, w, c]
  Shape out_shape() const { return image_shape(channels_last, n, c, oh, ow); }
  Shape out_shape_nchw() const { return {n, c, oh, ow}; }
};

}  // namespace mix
