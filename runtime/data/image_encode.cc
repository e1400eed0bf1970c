#include "runtime/data/image_encode.h"

#include <cstdlib>

#include "runtime/core/check.h"
#include "runtime/data/libjpeg_errors.h"

namespace mix::data {
namespace {

// Compresses img into *out / *out_size (malloc'ed by libjpeg); false on an
// error, its message in err. No C++ object with a destructor lives in this
// frame, so the jump skips nothing.
bool compress(const RgbImage& img, int quality, LibjpegErrorJump& err, jpeg_compress_struct& c, unsigned char** out,
              unsigned long* out_size) {
  if (setjmp(err.jump)) return false;
  jpeg_mem_dest(&c, out, out_size);
  c.image_width = static_cast<JDIMENSION>(img.width);
  c.image_height = static_cast<JDIMENSION>(img.height);
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);  // YCbCr, 4:2:0
  jpeg_set_quality(&c, quality, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<JSAMPLE*>(img.pixels.data() + static_cast<size_t>(c.next_scanline) * img.width * 3);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  return true;
}

}  // namespace

std::string encode_jpeg(const RgbImage& img, int quality) {
  MIX_CHECK(img.width > 0 && img.height > 0 && img.pixels.size() == static_cast<size_t>(img.width) * img.height * 3,
            "encode_jpeg: " << img.width << " x " << img.height << " image with " << img.pixels.size() << " bytes");
  MIX_CHECK(quality >= 1 && quality <= 100, "encode_jpeg: quality " << quality << " is outside 1..100");
  LibjpegErrorJump err;
  jpeg_compress_struct c{};
  use_error_jump(c, err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const bool ok = compress(img, quality, err, c, &buf, &size);
  jpeg_destroy_compress(&c);
  std::string bytes = ok ? std::string(reinterpret_cast<const char*>(buf), size) : std::string();
  std::free(buf);
  MIX_CHECK(ok, "encode_jpeg: libjpeg failed: " << err.message);
  return bytes;
}

}  // namespace mix::data
