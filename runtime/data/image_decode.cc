#include "runtime/data/image_decode.h"

#include <turbojpeg.h>

#include <memory>

#include "runtime/core/check.h"

namespace mix::data {
namespace {

// One TurboJPEG decompressor per call: cheap to create next to a decode, and
// no handle is shared between the worker threads.
struct TjHandle {
  tjhandle h = tjInitDecompress();
  ~TjHandle() {
    if (h) tjDestroy(h);
  }
};

// A JPEG starts with the SOI marker FF D8; anything else is refused before
// libjpeg-turbo sees it, so the error can say what the file is.
void check_is_jpeg(const std::string& bytes, const std::string& path) {
  MIX_CHECK(!bytes.empty(), path << ": the file is empty (0 bytes), not a JPEG");
  MIX_CHECK(!is_png(bytes), path << ": the file is a PNG, not a JPEG (despite its name?): PNG is not supported yet: "
                                    "convert it to JPEG");
  MIX_CHECK(bytes.size() >= 4 && static_cast<uint8_t>(bytes[0]) == 0xFF && static_cast<uint8_t>(bytes[1]) == 0xD8,
            path << ": not a JPEG file (it does not start with the JPEG marker FF D8)");
}

}  // namespace

bool is_png(const std::string& bytes) {
  static const char kSig[] = "\x89PNG\r\n\x1a\n";
  return bytes.size() >= 8 && bytes.compare(0, 8, kSig, 8) == 0;
}

JpegHeader read_jpeg_header(const std::string& bytes, const std::string& path) {
  check_is_jpeg(bytes, path);
  TjHandle tj;
  MIX_CHECK(tj.h, "cannot create a TurboJPEG decompressor: " << tjGetErrorStr());
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  const int rc = tjDecompressHeader3(tj.h, reinterpret_cast<const unsigned char*>(bytes.data()),
                                     static_cast<unsigned long>(bytes.size()), &w, &h, &subsamp, &colorspace);
  MIX_CHECK(rc == 0, path << ": damaged JPEG header: " << tjGetErrorStr2(tj.h));
  MIX_CHECK(w > 0 && h > 0, path << ": JPEG header gives an empty image (" << w << " x " << h << ")");
  return {w, h};
}

DctScale choose_dct_scale(double region_w, double region_h, int need_w, int need_h) {
  int n = 0;
  const tjscalingfactor* factors = tjGetScalingFactors(&n);
  DctScale best;
  for (int i = 0; i < n; ++i) {
    const DctScale s{factors[i].num, factors[i].denom};
    if (s.factor() > 1.0 || s.factor() >= best.factor()) continue;
    // The region's size after scaling, as the resize will see it.
    if (region_w * s.factor() >= need_w && region_h * s.factor() >= need_h) best = s;
  }
  return best;
}

RgbImage decode_jpeg(const std::string& bytes, const std::string& path, DctScale scale) {
  check_is_jpeg(bytes, path);
  TjHandle tj;
  MIX_CHECK(tj.h, "cannot create a TurboJPEG decompressor: " << tjGetErrorStr());
  const auto* src = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto size = static_cast<unsigned long>(bytes.size());
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  MIX_CHECK(tjDecompressHeader3(tj.h, src, size, &w, &h, &subsamp, &colorspace) == 0,
            path << ": damaged JPEG header: " << tjGetErrorStr2(tj.h));
  MIX_CHECK(colorspace != TJCS_CMYK && colorspace != TJCS_YCCK,
            path << ": a CMYK JPEG; only RGB and grayscale JPEGs are supported: convert it to RGB");
  RgbImage img;
  img.width = scale.apply(w);
  img.height = scale.apply(h);
  img.pixels.resize(static_cast<size_t>(img.width) * img.height * 3);
  // TJFLAG_STOPONWARNING: a truncated file is a warning to libjpeg (it pads
  // the missing rows with grey), which would train on made-up pixels.
  const int rc = tjDecompress2(tj.h, src, size, img.pixels.data(), img.width, img.width * 3, img.height, TJPF_RGB,
                               TJFLAG_STOPONWARNING);
  MIX_CHECK(rc == 0, path << ": corrupt or truncated JPEG: " << tjGetErrorStr2(tj.h));
  return img;
}

}  // namespace mix::data
