#pragma once
// torchvision's ImageNet transforms, on 8-bit RGB images: RandomResizedCrop
// plus a horizontal flip for training, Resize of the shorter side plus
// CenterCrop for evaluation, into 8-bit HWC pixels; ToTensor and Normalize
// into f32 CHW are normalize_image (on the device, the image_normalize op).
// Resampling is PIL's bilinear filter (what torchvision uses on PIL images):
// a triangle filter widened by the shrink factor, so shrinking averages every
// source pixel instead of skipping some (antialiasing).
#include <array>
#include <cstdint>

#include "runtime/core/random.h"
#include "runtime/data/image_decode.h"

namespace mix::data {

/// A rectangle of an image, in pixels (floating point, so that a box of the
/// full-size image keeps its place in an image decoded at a DCT scale).
struct CropBox {
  double x = 0, y = 0, width = 0, height = 0;
};

struct ImageTransformOptions {
  int64_t size = 224;  // output height and width
  /// Training: torchvision's RandomResizedCrop and RandomHorizontalFlip.
  /// false: the evaluation transform for training too (--augment none).
  bool augment = true;
  std::array<double, 2> crop_scale = {0.08, 1.0};          // fraction of the area
  std::array<double, 2> crop_ratio = {3.0 / 4.0, 4.0 / 3.0};  // width / height
  bool hflip = true;
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};  // ImageNet's, on [0, 1] pixels
  std::array<float, 3> stddev = {0.229f, 0.224f, 0.225f};
  /// Decode JPEGs at the smallest DCT scale that still covers the crop
  /// (false: always at full size, as torchvision does).
  bool dct_scaling = true;
  /// Decode only the rows and columns the crop covers (false: the whole image).
  bool region_decode = true;
};

/// torchvision's RandomResizedCrop.get_params on a width x height image:
/// up to ten draws of an area fraction (uniform in `scale`) and an aspect
/// ratio (log-uniform in `ratio`), the first that fits taken at a uniform
/// place; else the largest central box within the ratio range. Integer boxes.
CropBox random_resized_crop_box(int width, int height, const std::array<double, 2>& scale,
                                const std::array<double, 2>& ratio, Rng& rng);

/// Evaluation's Resize(resize) of the shorter side then CenterCrop(size), as
/// the part of the resized image that is kept: the size of the whole resized
/// image (out_w x out_h) and the crop's offset in it (torchvision's rounding).
struct ResizePlan {
  int out_w = 0, out_h = 0;
  int crop_x = 0, crop_y = 0;
};
ResizePlan eval_resize_plan(int width, int height, int64_t resize, int64_t size);

/// The resize before evaluation's centre crop: round(size * 256 / 224), ImageNet's ratio.
int64_t eval_resize_size(int64_t size);

/// Resamples `box` of `img` to out_w x out_h with PIL's bilinear filter
/// (horizontal pass, then vertical, each rounded to 8 bits as PIL does) and
/// writes the out_size x out_size window at (crop_x, crop_y) of the result,
/// mirrored left-right when `flip`, into `out`: 8-bit RGB, [out_size, out_size, 3].
void resample_crop(const RgbImage& img, const CropBox& box, int out_w, int out_h, int crop_x, int crop_y,
                   int64_t out_size, bool flip, uint8_t* out);

/// ToTensor and Normalize of a [size, size, 3] 8-bit image into f32
/// [3, size, size]: (v / 255 - mean) / std per channel (fn::NormalizePixel).
void normalize_image(const uint8_t* hwc, int64_t size, const ImageTransformOptions& opt, float* chw);

/// The whole transform of one encoded image: decodes it (a PNG when `path`
/// ends in .png, else a JPEG, at a DCT scale and only the crop's region when
/// allowed), crops, resizes and flips into `out`, 8-bit [size, size, 3].
/// `rng` draws the crop and flip (training only). `path` is named in errors.
void transform_image(const std::string& bytes, const std::string& path, bool train, const ImageTransformOptions& opt,
                     Rng& rng, uint8_t* out);

}  // namespace mix::data
