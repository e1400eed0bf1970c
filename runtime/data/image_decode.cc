#include "runtime/data/image_decode.h"

#include <png.h>

#include <algorithm>
#include <cctype>

#include "runtime/core/check.h"
#include "runtime/data/libjpeg_errors.h"

namespace mix::data {
namespace {

// A warning (level -1) is corrupt data libjpeg would paper over: a truncated
// file's missing rows come out grey. Training on made-up pixels is worse
// than stopping, so a warning is an error too; trace messages are dropped.
void stop_on_warning(j_common_ptr cinfo, int level) {
  if (level < 0) libjpeg_jump_on_error(cinfo);
}

// One decompressor, destroyed however the decode ends.
struct Decompressor {
  LibjpegErrorJump err;
  jpeg_decompress_struct cinfo{};
  Decompressor() {
    use_error_jump(cinfo, err);
    err.mgr.emit_message = stop_on_warning;
    jpeg_create_decompress(&cinfo);
  }
  ~Decompressor() { jpeg_destroy_decompress(&cinfo); }
  Decompressor(const Decompressor&) = delete;
  Decompressor& operator=(const Decompressor&) = delete;
};

// Reads the header of `bytes`; false (with the message in d.err) when libjpeg fails.
bool read_header(Decompressor& d, const std::string& bytes) {
  if (setjmp(d.err.jump)) return false;
  jpeg_mem_src(&d.cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&d.cinfo, TRUE);
  return true;
}

// Decodes rows [region.y, region.y + region.height) of the scaled image, the
// columns libjpeg widens region's to, into `out`; then reads the rest of the
// file's data (entropy decoding only, and the last row into `spare_row`, as
// wide as the scaled image) so that a damaged end is found too. False (with
// the message in d.err) when libjpeg fails.
bool decode_rows(Decompressor& d, DctScale scale, PixelRegion region, RgbImage* out, JSAMPLE* spare_row) {
  if (setjmp(d.err.jump)) return false;
  jpeg_decompress_struct& c = d.cinfo;
  c.scale_num = static_cast<unsigned>(scale.num);
  c.scale_denom = static_cast<unsigned>(scale.denom);
  c.out_color_space = JCS_RGB;  // grayscale too: libjpeg replicates it into R, G and B
  // The accurate integer IDCT and smooth chroma upsampling, as PIL and torchvision decode.
  c.dct_method = JDCT_ISLOW;
  c.do_fancy_upsampling = TRUE;
  jpeg_start_decompress(&c);
  const int full_h = static_cast<int>(c.output_height);
  // Subsampled chroma is upsampled with its neighbours (fancy upsampling),
  // and libjpeg upsamples the last column of a cropped row as if it were the
  // image's edge: decoding a few columns more on each side keeps the region's
  // own pixels those of the full decode.
  constexpr int kEdgeColumns = 2;
  const int full_w = static_cast<int>(c.output_width);
  const int x_lo = std::max(0, region.x - kEdgeColumns);
  const int x_hi = std::min(full_w, region.x + region.width + kEdgeColumns);
  JDIMENSION x = static_cast<JDIMENSION>(x_lo), w = static_cast<JDIMENSION>(x_hi - x_lo);
  if (x_lo > 0 || x_hi < full_w) jpeg_crop_scanline(&c, &x, &w);
  out->x0 = static_cast<int>(x);
  out->y0 = region.y;
  out->width = static_cast<int>(c.output_width);  // the widened column range
  out->height = region.height;
  out->pixels.resize(static_cast<size_t>(out->width) * out->height * 3);
  const size_t stride = static_cast<size_t>(out->width) * 3;
  if (region.y > 0) jpeg_skip_scanlines(&c, static_cast<JDIMENSION>(region.y));
  const int end = region.y + region.height;
  while (static_cast<int>(c.output_scanline) < end) {
    JSAMPROW rows[16];
    const int n = std::min<int>(16, end - static_cast<int>(c.output_scanline));
    for (int i = 0; i < n; ++i)
      rows[i] = out->pixels.data() + static_cast<size_t>(static_cast<int>(c.output_scanline) - region.y + i) * stride;
    jpeg_read_scanlines(&c, rows, static_cast<JDIMENSION>(n));
  }
  if (end < full_h) {
    // Skipping to the very end would mark the file finished without reading
    // it; skip to the last row (entropy decoding the rows between) and read it.
    if (end < full_h - 1) jpeg_skip_scanlines(&c, static_cast<JDIMENSION>(full_h - 1 - end));
    JSAMPROW row = spare_row;
    jpeg_read_scanlines(&c, &row, 1);
  }
  jpeg_finish_decompress(&c);
  return true;
}

// A JPEG starts with the SOI marker FF D8; anything else is refused before
// libjpeg sees it, so the error can say what the file is.
void check_is_jpeg(const std::string& bytes, const std::string& path) {
  MIX_CHECK(!bytes.empty(), path << ": the file is empty (0 bytes), not a JPEG");
  MIX_CHECK(!is_png(bytes), path << ": the file is a PNG named as a JPEG: rename it .png (the readers decode by the "
                                    "name's extension)");
  MIX_CHECK(bytes.size() >= 4 && static_cast<uint8_t>(bytes[0]) == 0xFF && static_cast<uint8_t>(bytes[1]) == 0xD8,
            path << ": not a JPEG file (it does not start with the JPEG marker FF D8)");
}

}  // namespace

bool is_png(const std::string& bytes) {
  static const char kSig[] = "\x89PNG\r\n\x1a\n";
  return bytes.size() >= 8 && bytes.compare(0, 8, kSig, 8) == 0;
}

bool has_png_name(const std::string& name) {
  if (name.size() < 4) return false;
  std::string ext = name.substr(name.size() - 4);
  for (char& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return ext == ".png";
}

RgbImage decode_png(const std::string& bytes, const std::string& path) {
  MIX_CHECK(!bytes.empty(), path << ": the file is empty (0 bytes), not a PNG");
  MIX_CHECK(bytes.size() < 2 || static_cast<uint8_t>(bytes[0]) != 0xFF || static_cast<uint8_t>(bytes[1]) != 0xD8,
            path << ": the file is a JPEG named as a PNG: rename it .jpg (the readers decode by the name's extension)");
  MIX_CHECK(is_png(bytes), path << ": not a PNG file (it does not start with the PNG signature)");
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  // libpng's simplified API reports through png.message; png_image_free
  // releases what a failed or finished read holds.
  struct Free {
    png_image* p;
    ~Free() { png_image_free(p); }
  } free_png{&png};
  MIX_CHECK(png_image_begin_read_from_memory(&png, bytes.data(), bytes.size()) != 0,
            path << ": damaged PNG header: " << png.message);
  // RGBA, then the alpha dropped: with an RGB output libpng would composite
  // onto a background, where PIL's convert("RGB") keeps the colour values.
  png.format = PNG_FORMAT_RGBA;
  MIX_CHECK(png.width > 0 && png.height > 0 && png.width <= 65535 && png.height <= 65535,
            path << ": a PNG of " << png.width << " x " << png.height << " pixels (1 to 65535 a side are read)");
  std::vector<uint8_t> rgba(PNG_IMAGE_SIZE(png));
  MIX_CHECK(png_image_finish_read(&png, nullptr, rgba.data(), 0, nullptr) != 0,
            path << ": corrupt or truncated PNG: " << png.message);
  RgbImage img;
  img.width = static_cast<int>(png.width);
  img.height = static_cast<int>(png.height);
  img.pixels.resize(static_cast<size_t>(img.width) * img.height * 3);
  for (size_t i = 0, n = static_cast<size_t>(img.width) * img.height; i < n; ++i)
    for (int c = 0; c < 3; ++c) img.pixels[i * 3 + c] = rgba[i * 4 + c];
  return img;
}

JpegHeader read_jpeg_header(const std::string& bytes, const std::string& path) {
  check_is_jpeg(bytes, path);
  Decompressor d;
  MIX_CHECK(read_header(d, bytes), path << ": damaged JPEG header: " << d.err.message);
  const int w = static_cast<int>(d.cinfo.image_width), h = static_cast<int>(d.cinfo.image_height);
  MIX_CHECK(w > 0 && h > 0, path << ": JPEG header gives an empty image (" << w << " x " << h << ")");
  return {w, h};
}

DctScale choose_dct_scale(double region_w, double region_h, int need_w, int need_h) {
  // libjpeg-turbo scales by any n/8, but only 1/8, 1/4 and 1/2 have SIMD
  // IDCTs: 3/4 is slower to decode than 1/1 plus the larger resample after
  // it. Like PIL's draft(), only those are chosen.
  for (int n : {1, 2, 4}) {
    const DctScale s{n, 8};
    if (region_w * s.factor() >= need_w && region_h * s.factor() >= need_h) return s;
  }
  return {};
}

RgbImage decode_jpeg(const std::string& bytes, const std::string& path, DctScale scale, const PixelRegion* region) {
  RgbImage img;
  decode_jpeg_into(bytes, path, scale, region, img);
  return img;
}

void decode_jpeg_into(const std::string& bytes, const std::string& path, DctScale scale, const PixelRegion* region,
                      RgbImage& out) {
  check_is_jpeg(bytes, path);
  Decompressor d;
  MIX_CHECK(read_header(d, bytes), path << ": damaged JPEG header: " << d.err.message);
  const J_COLOR_SPACE cs = d.cinfo.jpeg_color_space;
  MIX_CHECK(cs != JCS_CMYK && cs != JCS_YCCK,
            path << ": a CMYK JPEG; only RGB and grayscale JPEGs are supported: convert it to RGB");
  const int w = scale.apply(static_cast<int>(d.cinfo.image_width));
  const int h = scale.apply(static_cast<int>(d.cinfo.image_height));
  PixelRegion r{0, 0, w, h};
  if (region) {
    // Clipped to the image; an empty region still decodes one pixel, so the file is checked.
    r.x = std::clamp(region->x, 0, w - 1);
    r.y = std::clamp(region->y, 0, h - 1);
    r.width = std::clamp(region->width, 1, w - r.x);
    r.height = std::clamp(region->height, 1, h - r.y);
  }
  thread_local std::vector<JSAMPLE> spare_row;
  spare_row.resize(static_cast<size_t>(w) * 3);
  MIX_CHECK(decode_rows(d, scale, r, &out, spare_row.data()), path << ": corrupt or truncated JPEG: " << d.err.message);
}

}  // namespace mix::data
