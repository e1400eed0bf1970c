#include "runtime/data/image_transforms.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/kernels/functors.h"

namespace mix::data {
namespace {

// PIL's 8-bit resampling works in fixed point with this many fraction bits
// (32 bits less 8 for the pixel and 2 of headroom); matching it makes our
// output the same bits as torchvision's on the same decoded pixels.
constexpr int kPrecisionBits = 32 - 8 - 2;

// Python's round(): halves to even, which std::nearbyint does in the default rounding mode.
int round_half_even(double x) { return static_cast<int>(std::nearbyint(x)); }

// The taps of a 1-D resample: output i reads input pixels start[i] ..
// start[i] + count[i] - 1 with weights k[i * taps ...], fixed point.
struct Taps {
  int taps = 0;
  std::vector<int> start, count;
  std::vector<int32_t> k;
};

// PIL's bilinear coefficients for the outputs [first, first + n) of a resample
// of the input span [in0, in1) to `out_total` pixels, reading only pixels in
// [lo, hi): centre of output i at in0 + (i + 0.5) * scale; a triangle filter
// of half-width max(scale, 1), so that shrinking averages all the pixels it covers.
Taps bilinear_taps(double in0, double in1, int lo, int hi, int out_total, int first, int n) {
  const double scale = (in1 - in0) / out_total;
  const double filterscale = std::max(scale, 1.0);
  const double support = filterscale;  // the triangle's support is 1, widened
  Taps t;
  t.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.start.resize(n);
  t.count.resize(n);
  t.k.assign(static_cast<size_t>(n) * t.taps, 0);
  std::vector<double> w(t.taps);
  for (int i = 0; i < n; ++i) {
    const double center = in0 + (first + i + 0.5) * scale;
    // Truncation as PIL's (int) casts, then clamped to the readable span.
    const int xmin = std::max(static_cast<int>(center - support + 0.5), lo);
    const int xmax = std::min(static_cast<int>(center + support + 0.5), hi);
    const int cnt = std::max(0, std::min(xmax - xmin, t.taps));
    double total = 0;
    for (int j = 0; j < cnt; ++j) {
      const double d = std::fabs((j + xmin - center + 0.5) / filterscale);
      w[j] = d < 1.0 ? 1.0 - d : 0.0;
      total += w[j];
    }
    for (int j = 0; j < cnt; ++j) {
      const double v = total != 0.0 ? w[j] / total : w[j];
      t.k[static_cast<size_t>(i) * t.taps + j] =
          static_cast<int32_t>(v < 0 ? -0.5 + v * (1 << kPrecisionBits) : 0.5 + v * (1 << kPrecisionBits));
    }
    t.start[i] = xmin;
    t.count[i] = cnt;
  }
  return t;
}

// The resampling passes run the same integer loop on every host; the AVX2
// copy is picked at load time where the CPU has it (the results are the same
// bits: integer arithmetic), the plain one elsewhere. Not under
// ThreadSanitizer (scripts/sanitize.sh --thread): it instruments the load-time
// picker too, which then runs before TSan's runtime has started, and crashes.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define MIX_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MIX_VECTOR_CLONES
#endif

// out[i] = PIL's clip8(sum_j k[j] * rows[j][i]) for i < len, rows `stride`
// bytes apart: one output row of a resampling pass, as a weighted sum of
// whole input rows, so the loop over i is contiguous and vectorises. The
// accumulator fits int32 as PIL's does: the weights are non-negative and sum
// to 2^22, and 255 * 2^22 plus the rounding half is below 2^31.
MIX_VECTOR_CLONES void weighted_rows(const uint8_t* rows, size_t stride, int count, const int32_t* k, int len,
                                     int32_t* acc, uint8_t* out) {
  for (int i = 0; i < len; ++i) acc[i] = 1 << (kPrecisionBits - 1);
  for (int j = 0; j < count; ++j) {
    const uint8_t* row = rows + static_cast<size_t>(j) * stride;
    const int32_t kj = k[j];
    for (int i = 0; i < len; ++i) acc[i] += static_cast<int32_t>(row[i]) * kj;
  }
  // PIL's clip8: below 0 is 0, at or above 255 << 22 is 255.
  for (int i = 0; i < len; ++i) out[i] = static_cast<uint8_t>(std::clamp(acc[i] >> kPrecisionBits, 0, 255));
}

// dst[x][y] = src[y][x] for pixels of 3 bytes: src has `rows` rows of `cols`
// pixels, `src_stride` bytes apart; dst has `cols` rows of `rows` pixels,
// each row mirrored (dst[x][rows - 1 - y]) when `flip`.
void transpose_pixels(const uint8_t* src, size_t src_stride, int rows, int cols, bool flip, uint8_t* dst) {
  for (int y = 0; y < rows; ++y) {
    const uint8_t* s = src + static_cast<size_t>(y) * src_stride;
    const size_t at = static_cast<size_t>(flip ? rows - 1 - y : y);
    for (int x = 0; x < cols; ++x) {
      uint8_t* d = dst + (static_cast<size_t>(x) * rows + at) * 3;
      d[0] = s[x * 3], d[1] = s[x * 3 + 1], d[2] = s[x * 3 + 2];
    }
  }
}

}  // namespace

CropBox random_resized_crop_box(int width, int height, const std::array<double, 2>& scale,
                                const std::array<double, 2>& ratio, Rng& rng) {
  const double area = static_cast<double>(width) * height;
  const double log_lo = std::log(ratio[0]), log_hi = std::log(ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * (scale[0] + (scale[1] - scale[0]) * rng.uniform());
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * rng.uniform());
    const int w = round_half_even(std::sqrt(target_area * aspect));
    const int h = round_half_even(std::sqrt(target_area / aspect));
    if (w > 0 && h > 0 && w <= width && h <= height) {
      const int y = static_cast<int>(rng.below(static_cast<uint64_t>(height - h + 1)));
      const int x = static_cast<int>(rng.below(static_cast<uint64_t>(width - w + 1)));
      return {double(x), double(y), double(w), double(h)};
    }
  }
  // No draw fitted: the whole image, cut to the nearest allowed aspect ratio, centred.
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < std::min(ratio[0], ratio[1])) {
    h = round_half_even(w / std::min(ratio[0], ratio[1]));
  } else if (in_ratio > std::max(ratio[0], ratio[1])) {
    w = round_half_even(h * std::max(ratio[0], ratio[1]));
  }
  return {double((width - w) / 2), double((height - h) / 2), double(w), double(h)};
}

int64_t eval_resize_size(int64_t size) { return static_cast<int64_t>(std::nearbyint(size * 256.0 / 224.0)); }

ResizePlan eval_resize_plan(int width, int height, int64_t resize, int64_t size) {
  ResizePlan p;
  // torchvision's Resize(int): the shorter side becomes `resize`, the longer
  // keeps the aspect ratio, truncated.
  const int64_t shorter = std::min(width, height), longer = std::max(width, height);
  const int new_long = static_cast<int>(static_cast<double>(resize * longer) / static_cast<double>(shorter));
  p.out_w = width <= height ? static_cast<int>(resize) : new_long;
  p.out_h = width <= height ? new_long : static_cast<int>(resize);
  // CenterCrop's offsets, rounded as torchvision does.
  p.crop_x = round_half_even((p.out_w - size) / 2.0);
  p.crop_y = round_half_even((p.out_h - size) / 2.0);
  return p;
}

void resample_crop(const RgbImage& img, const CropBox& box, int out_w, int out_h, int crop_x, int crop_y,
                   int64_t out_size, bool flip, uint8_t* out) {
  const int n = static_cast<int>(out_size);
  MIX_CHECK(crop_x >= 0 && crop_y >= 0 && crop_x + n <= out_w && crop_y + n <= out_h,
            "image transform: the " << n << " x " << n << " crop at (" << crop_x << ", " << crop_y
                                    << ") is outside the resized " << out_w << " x " << out_h << " image");
  // Only the pixels inside the box are read, as when torchvision crops first and resizes the crop.
  const int x_lo = std::max(0, static_cast<int>(std::floor(box.x)));
  const int x_hi = std::min(img.width, static_cast<int>(std::ceil(box.x + box.width)));
  const int y_lo = std::max(0, static_cast<int>(std::floor(box.y)));
  const int y_hi = std::min(img.height, static_cast<int>(std::ceil(box.y + box.height)));
  const Taps tx = bilinear_taps(box.x, box.x + box.width, x_lo, x_hi, out_w, crop_x, n);
  const Taps ty = bilinear_taps(box.y, box.y + box.height, y_lo, y_hi, out_h, crop_y, n);
  // The source rows the vertical pass reads and the columns the horizontal pass reads.
  int row_first = img.height, row_last = 0, col_first = img.width, col_last = 0;
  for (int i = 0; i < n; ++i) {
    row_first = std::min(row_first, ty.start[i]);
    row_last = std::max(row_last, ty.start[i] + ty.count[i]);
    col_first = std::min(col_first, tx.start[i]);
    col_last = std::max(col_last, tx.start[i] + tx.count[i]);
  }
  const int rows = std::max(0, row_last - row_first), cols = std::max(0, col_last - col_first);
  // PIL resizes horizontally, then vertically, rounding to 8 bits between.
  // The horizontal pass runs on the transposed region, where it is a weighted
  // sum of whole rows (contiguous); its result is transposed back (mirrored
  // when flipping, which commutes with the vertical pass) for the vertical pass.
  const size_t stride = static_cast<size_t>(img.width) * 3;
  // Scratch memory kept by each worker thread from image to image.
  thread_local std::vector<uint8_t> region_t, across_t, across;
  thread_local std::vector<int32_t> acc;
  region_t.resize(static_cast<size_t>(cols) * rows * 3);  // [cols][rows][3]
  transpose_pixels(img.pixels.data() + row_first * stride + static_cast<size_t>(col_first) * 3, stride, rows, cols,
                   /*flip=*/false, region_t.data());
  acc.resize(static_cast<size_t>(std::max(rows, n)) * 3);
  across_t.resize(static_cast<size_t>(n) * rows * 3);  // [n][rows][3]
  const size_t col_bytes = static_cast<size_t>(rows) * 3;
  for (int i = 0; i < n; ++i)
    weighted_rows(region_t.data() + (tx.start[i] - col_first) * col_bytes, col_bytes, tx.count[i],
                  tx.k.data() + static_cast<size_t>(i) * tx.taps, rows * 3, acc.data(),
                  across_t.data() + i * col_bytes);
  across.resize(static_cast<size_t>(rows) * n * 3);  // [rows][n][3]
  transpose_pixels(across_t.data(), col_bytes, n, rows, flip, across.data());
  const size_t row_bytes = static_cast<size_t>(n) * 3;
  for (int y = 0; y < n; ++y)
    weighted_rows(across.data() + (ty.start[y] - row_first) * row_bytes, row_bytes, ty.count[y],
                  ty.k.data() + static_cast<size_t>(y) * ty.taps, n * 3, acc.data(), out + y * row_bytes);
}

void normalize_image(const uint8_t* hwc, int64_t size, const ImageTransformOptions& opt, float* chw) {
  const size_t plane = static_cast<size_t>(size) * size;
  for (int c = 0; c < 3; ++c) {
    const fn::NormalizePixel f{opt.mean[c], opt.stddev[c]};
    for (size_t i = 0; i < plane; ++i) chw[c * plane + i] = f(hwc[i * 3 + c]);
  }
}

void transform_image(const std::string& bytes, const std::string& path, bool train, const ImageTransformOptions& opt,
                     Rng& rng, uint8_t* out) {
  // A PNG is decoded whole (no DCT to scale, no region to skip to); a JPEG's
  // size comes from its header, and its pixels after the crop is chosen.
  const bool png = has_png_name(path);
  thread_local RgbImage img;
  JpegHeader size;
  if (png) {
    img = decode_png(bytes, path);
    size = {img.width, img.height};
  } else {
    size = read_jpeg_header(bytes, path);
  }
  const int n = static_cast<int>(opt.size);
  // The box and sizes are decided on the full-size image, so the crop is the
  // same whatever scale the decoder then uses.
  CropBox box{0, 0, double(size.width), double(size.height)};
  int out_w = n, out_h = n, crop_x = 0, crop_y = 0;
  bool flip = false;
  if (train && opt.augment) {
    box = random_resized_crop_box(size.width, size.height, opt.crop_scale, opt.crop_ratio, rng);
    flip = opt.hflip && rng.uniform() < 0.5;
  } else {
    const ResizePlan p = eval_resize_plan(size.width, size.height, eval_resize_size(opt.size), opt.size);
    out_w = p.out_w, out_h = p.out_h, crop_x = p.crop_x, crop_y = p.crop_y;
  }
  if (png) {
    resample_crop(img, box, out_w, out_h, crop_x, crop_y, opt.size, flip, out);
    return;
  }
  const DctScale s = opt.dct_scaling ? choose_dct_scale(box.width, box.height, out_w, out_h) : DctScale{};
  const double f = s.factor();
  CropBox scaled{box.x * f, box.y * f, box.width * f, box.height * f};
  // Only the pixels the resample reads are decoded.
  PixelRegion region;
  region.x = static_cast<int>(std::floor(scaled.x));
  region.y = static_cast<int>(std::floor(scaled.y));
  region.width = static_cast<int>(std::ceil(scaled.x + scaled.width)) - region.x;
  region.height = static_cast<int>(std::ceil(scaled.y + scaled.height)) - region.y;
  decode_jpeg_into(bytes, path, s, opt.region_decode ? &region : nullptr, img);
  scaled.x -= img.x0;
  scaled.y -= img.y0;
  resample_crop(img, scaled, out_w, out_h, crop_x, crop_y, opt.size, flip, out);
}

}  // namespace mix::data
