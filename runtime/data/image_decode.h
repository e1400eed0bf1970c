#pragma once
// Decoding one image file into 8-bit RGB, for the image readers. PNGs go
// through libpng's simplified API, whole. JPEGs go
// through libjpeg-turbo's libjpeg API, which can decode at a reduced scale in
// the DCT domain (1/8, 2/8, ... 7/8) and only a region of the image: a large
// photo that will be cropped and shrunk to 224 x 224 is neither decoded at
// full size nor outside its crop (what PIL's draft() and DALI's ROI decode do).
#include <cstdint>
#include <string>
#include <vector>

namespace mix::data {

/// Interleaved 8-bit RGB pixels, row major: pixels[(y * width + x) * 3 + c].
/// A region decode holds part of the (scaled) image: these pixels start at
/// column x0 and row y0 of it.
struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;
  int x0 = 0, y0 = 0;
};

/// A JPEG's size, read from its header only.
struct JpegHeader {
  int width = 0, height = 0;
};

/// Reads the header of the JPEG `bytes` (from `path`, named in errors).
/// Throws mix::Error naming the file when it is not a JPEG (a PNG renamed
/// .jpg says so, as does an empty file) or its header is damaged.
JpegHeader read_jpeg_header(const std::string& bytes, const std::string& path);

/// The scale num/denom of libjpeg's DCT-domain scaling (denom 8).
struct DctScale {
  int num = 1, denom = 1;
  /// A dimension after scaling, rounded up as libjpeg does (jdiv_round_up).
  int apply(int dim) const { return static_cast<int>((static_cast<int64_t>(dim) * num + denom - 1) / denom); }
  double factor() const { return static_cast<double>(num) / denom; }
};

/// The smallest of the scales 1/8, 1/4 and 1/2 under which a region of
/// region_w x region_h pixels still has at least need_w x need_h pixels, so
/// that resizing it afterwards only ever shrinks (as PIL's draft() and DALI
/// choose); 1/1 when none smaller does.
DctScale choose_dct_scale(double region_w, double region_h, int need_w, int need_h);

/// A rectangle of pixels of the scaled image: columns [x, x + width), rows [y, y + height).
struct PixelRegion {
  int x = 0, y = 0, width = 0, height = 0;
};

/// Decodes the JPEG `bytes` at `scale` into RGB (grayscale is replicated into
/// the three channels, as PIL's convert("RGB")). With `region`, only the
/// pixels covering it are decoded (the result may be wider: libjpeg starts a
/// column range at a block boundary; see RgbImage::x0), and each pixel is the
/// same as in the full decode. The whole file is still read to its end, so a
/// truncated or corrupt file is an error whatever the region. Errors (a
/// truncated or corrupt file, CMYK) throw mix::Error naming `path`.
RgbImage decode_jpeg(const std::string& bytes, const std::string& path, DctScale scale = {},
                     const PixelRegion* region = nullptr);
/// The same into `out`, reusing its memory (a worker decodes image after
/// image into one buffer instead of allocating and clearing each time).
void decode_jpeg_into(const std::string& bytes, const std::string& path, DctScale scale, const PixelRegion* region,
                      RgbImage& out);

/// Whether `bytes` start with the PNG signature.
bool is_png(const std::string& bytes);

/// Whether `name` (a path, or a shard member's name) ends in .png, any case:
/// the readers decode by the name, as a folder's listing picks files by it.
bool has_png_name(const std::string& name);

/// Decodes the PNG `bytes` into RGB: grayscale replicated, a palette
/// expanded, 16-bit samples reduced to 8, an alpha channel dropped (PIL's
/// convert("RGB")). A file that is not a PNG (a JPEG named .png says so), is
/// cut short or is corrupt throws mix::Error naming `path`.
RgbImage decode_png(const std::string& bytes, const std::string& path);

}  // namespace mix::data
