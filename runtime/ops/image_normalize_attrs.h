#pragma once
// image_normalize's attribute and shape rules, shared by its CPU kernel
// (runtime/ops/image_normalize.cc) and its CUDA launcher
// (runtime/ops/cuda/image_normalize.cu), so both devices read and check the
// attributes alike and run the same per-channel functors.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/dtype.h"
#include "runtime/core/tensor.h"
#include "runtime/ir/program.h"
#include "runtime/kernels/functors.h"
#include "runtime/ops/data_format.h"

namespace mix::image_normalize_rules {

/// The most channels an image may have (RGB; gray and RGBA fit too): the
/// per-channel functors travel to the GPU by value, in the kernel's parameters.
inline constexpr int64_t kMaxChannels = 4;

/// What the kernels need from the op: one normaliser per channel, the output's
/// layout and its dtype.
struct Params {
  int64_t channels = 0;
  fn::NormalizePixel per_channel[kMaxChannels] = {};
  bool channels_last = false;  // Out [N, H, W, C] as X, else [N, C, H, W]
  DType out_dtype = DType::f32;
};

/// The op's attributes checked against X (u8 [N, H, W, C]); `x_shape` may
/// hold -1 for the batch (shape inference).
inline Params params(const OpDesc& op, DType x_dtype, const Shape& x_shape) {
  MIX_CHECK(x_dtype == DType::u8 && x_shape.size() == 4,
            op.type << ": X is " << dtype_name(x_dtype) << shape_str(x_shape)
                    << ", expected 8-bit pixels u8 [N, H, W, C] (the image readers' batches)");
  Params p;
  p.channels = x_shape[3];
  MIX_CHECK(p.channels >= 1 && p.channels <= kMaxChannels,
            op.type << ": X has " << p.channels << " channels, expected 1 to " << kMaxChannels);
  const std::vector<double> mean = op.attr<std::vector<double>>("mean", {});
  const std::vector<double> stddev = op.attr<std::vector<double>>("std", {});
  MIX_CHECK(static_cast<int64_t>(mean.size()) == p.channels && static_cast<int64_t>(stddev.size()) == p.channels,
            op.type << ": attrs mean and std need one value per channel of X (" << p.channels << "), got "
                    << mean.size() << " and " << stddev.size());
  for (int64_t c = 0; c < p.channels; ++c) {
    const auto m = static_cast<float>(mean[static_cast<size_t>(c)]);
    const auto s = static_cast<float>(stddev[static_cast<size_t>(c)]);
    MIX_CHECK(std::isfinite(m) && std::isfinite(s) && s != 0.f, op.type << ": channel " << c << " has mean " << m
                                                                        << " and std " << s
                                                                        << " (both must be finite, the std nonzero)");
    p.per_channel[c] = fn::NormalizePixel{m, s};
  }
  p.channels_last = channels_last_attr(op, "data_format");
  p.out_dtype = parse_dtype(op.attr<std::string>("out_dtype", "f32"));
  MIX_CHECK(is_floating(p.out_dtype),
            op.type << ": out_dtype " << dtype_name(p.out_dtype) << " is not a floating dtype (f32, f16 or bf16)");
  return p;
}

/// Out's shape: X's [N, H, W, C] channels last, else [N, C, H, W].
inline Shape out_shape(const Shape& x, bool channels_last) {
  return channels_last ? x : layout::channels_first_shape(x);
}

}  // namespace mix::image_normalize_rules
