#pragma once
// Shape rules of the convolution-family ops (conv2d, pool2d): their
// attributes read into ConvDims and PoolDims (runtime/kernels/conv_dims.h),
// shared by their CPU kernels, their cuDNN launchers and build-time inference,
// so that the devices can never disagree on an output size.
//
// Attributes follow Paddle: `strides`, `paddings`, `dilations` are [h, w]
// pairs (a single value applies to both), `groups` splits the channels, and
// `data_format` NHWC makes Input and Output (conv2d) or X and Out (pool2d)
// channels last (runtime/ops/data_format.h). The dims below are always named
// n, c, h, w whatever the layout; out_shape() is in the op's layout.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/tensor.h"
#include "runtime/ir/program.h"
#include "runtime/kernels/conv_dims.h"
#include "runtime/ops/data_format.h"

namespace mix {

/// A [h, w] attribute; one value means the same for both.
inline std::vector<int64_t> pair_attr(const OpDesc& op, const std::string& name, int64_t fallback) {
  std::vector<int64_t> v = op.attr<std::vector<int64_t>>(name, {fallback, fallback});
  if (v.size() == 1) v.push_back(v[0]);
  MIX_CHECK(v.size() == 2, op.type << ": attr " << name << " needs 1 or 2 values ([h, w]), got " << v.size());
  return v;
}

/// Checks conv2d's input and filter against its attributes; `n` may be -1 (build time).
inline ConvDims conv_dims(const OpDesc& op, const Shape& input, const Shape& filter) {
  const bool last = channels_last_attr(op, "data_format");
  MIX_CHECK(input.size() == 4, "conv2d: Input must be " << (last ? "[N, H, W, C]" : "[N, C, H, W]") << ", got "
                                                        << shape_str(input));
  MIX_CHECK(filter.size() == 4, "conv2d: Filter must be [OC, C/groups, KH, KW], got " << shape_str(filter));
  const auto s = pair_attr(op, "strides", 1), p = pair_attr(op, "paddings", 0), d = pair_attr(op, "dilations", 1);
  const Shape x = last ? layout::channels_first_shape(input) : input;  // [n, c, h, w]
  ConvDims r{x[0], x[1], x[2], x[3], filter[0], filter[2], filter[3], 0,    0,
             s[0], s[1], p[0], p[1], d[0],      d[1],      op.attr<int64_t>("groups", 1), last};
  MIX_CHECK(r.stride_h > 0 && r.stride_w > 0 && r.dil_h > 0 && r.dil_w > 0 && r.pad_h >= 0 && r.pad_w >= 0,
            "conv2d: strides and dilations must be positive and paddings non-negative");
  MIX_CHECK(r.groups > 0 && r.c % r.groups == 0 && r.oc % r.groups == 0,
            "conv2d: groups " << r.groups << " must divide the input channels " << r.c << " and the filters " << r.oc);
  MIX_CHECK(filter[1] == r.c / r.groups, "conv2d: Filter " << shape_str(filter) << " expects " << filter[1] * r.groups
                                                            << " input channels with groups " << r.groups
                                                            << ", Input " << shape_str(input) << " has " << r.c);
  r.oh = window_out_size(r.h, r.kh, r.stride_h, r.pad_h, r.dil_h);
  r.ow = window_out_size(r.w, r.kw, r.stride_w, r.pad_w, r.dil_w);
  MIX_CHECK(r.oh > 0 && r.ow > 0, "conv2d: a " << r.kh << "x" << r.kw << " filter (dilation " << r.dil_h << "x"
                                               << r.dil_w << ") does not fit the padded " << r.h << "x" << r.w
                                               << " input");
  return r;
}

/// Checks pool2d's input against its attributes. global_pooling makes the
/// window the whole plane (ksize, strides and paddings are then ignored).
inline PoolDims pool_dims(const OpDesc& op, const Shape& input) {
  const bool last = channels_last_attr(op, "data_format");
  MIX_CHECK(input.size() == 4,
            "pool2d: X must be " << (last ? "[N, H, W, C]" : "[N, C, H, W]") << ", got " << shape_str(input));
  const Shape x = last ? layout::channels_first_shape(input) : input;  // [n, c, h, w]
  const std::string type = op.attr<std::string>("pooling_type", "max");
  MIX_CHECK(type == "max" || type == "avg", "pool2d: pooling_type must be max or avg, got '" << type << "'");
  MIX_CHECK(!op.attr<bool>("ceil_mode", false), "pool2d: ceil_mode is not supported (output sizes round down)");
  PoolDims r{x[0], x[1], x[2], x[3], 0, 0, 1, 1, 0, 0, 0, 0, type == "max", op.attr<bool>("exclusive", true), last};
  if (op.attr<bool>("global_pooling", false)) {
    MIX_CHECK(r.h > 0 && r.w > 0, "pool2d: global pooling needs known H and W, got " << shape_str(input));
    r.kh = r.h;
    r.kw = r.w;
  } else {
    const auto k = pair_attr(op, "ksize", 0), s = pair_attr(op, "strides", 1), p = pair_attr(op, "paddings", 0);
    r.kh = k[0], r.kw = k[1], r.stride_h = s[0], r.stride_w = s[1], r.pad_h = p[0], r.pad_w = p[1];
  }
  MIX_CHECK(r.kh > 0 && r.kw > 0 && r.stride_h > 0 && r.stride_w > 0,
            "pool2d: ksize and strides must be positive (set ksize, or global_pooling)");
  // A window that starts in the padding and never reaches the input would pool nothing.
  MIX_CHECK(r.pad_h < r.kh && r.pad_w < r.kw, "pool2d: paddings [" << r.pad_h << ", " << r.pad_w
                                                                   << "] must be smaller than ksize [" << r.kh << ", "
                                                                   << r.kw << "]");
  r.oh = window_out_size(r.h, r.kh, r.stride_h, r.pad_h, 1);
  r.ow = window_out_size(r.w, r.kw, r.stride_w, r.pad_w, 1);
  MIX_CHECK(r.oh > 0 && r.ow > 0, "pool2d: a " << r.kh << "x" << r.kw << " window does not fit the padded " << r.h
                                               << "x" << r.w << " input");
  return r;
}

}  // namespace mix
