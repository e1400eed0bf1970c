#pragma once
// Decoding one image file into 8-bit RGB, for the image-folder data set.
// JPEGs go through libjpeg-turbo's TurboJPEG API, which can decode at a
// reduced scale in the DCT domain (1/2, 1/4, 1/8, ...): a large photo that
// will be cropped and shrunk to 224 x 224 need not be decoded at full size.
#include <cstdint>
#include <string>
#include <vector>

namespace mix::data {

/// Interleaved 8-bit RGB pixels, row major: pixels[(y * width + x) * 3 + c].
struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;
};

/// A JPEG's size and the DCT scalings its decoder offers, read from the header only.
struct JpegHeader {
  int width = 0, height = 0;
};

/// Reads the header of the JPEG `bytes` (from `path`, named in errors).
/// Throws mix::Error naming the file when it is not a JPEG (a PNG renamed
/// .jpg says so, as does an empty file) or its header is damaged.
JpegHeader read_jpeg_header(const std::string& bytes, const std::string& path);

/// The scale num/denom of libjpeg-turbo's DCT-domain scaling.
struct DctScale {
  int num = 1, denom = 1;
  /// A dimension after scaling, rounded up as libjpeg-turbo does (TJSCALED).
  int apply(int dim) const { return static_cast<int>((static_cast<int64_t>(dim) * num + denom - 1) / denom); }
  double factor() const { return static_cast<double>(num) / denom; }
};

/// The smallest of libjpeg-turbo's scales at most 1 under which a region of
/// region_w x region_h pixels still has at least need_w x need_h pixels, so
/// that resizing it afterwards only ever shrinks (as PIL's draft() and DALI
/// choose); 1/1 when none smaller does.
DctScale choose_dct_scale(double region_w, double region_h, int need_w, int need_h);

/// Decodes the JPEG `bytes` at `scale` into RGB (grayscale is replicated into
/// the three channels, as PIL's convert("RGB")). Errors (a truncated or
/// corrupt file, CMYK) throw mix::Error naming `path`.
RgbImage decode_jpeg(const std::string& bytes, const std::string& path, DctScale scale = {});

/// Whether `bytes` start with the PNG signature.
bool is_png(const std::string& bytes);

}  // namespace mix::data
