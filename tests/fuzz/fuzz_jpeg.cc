// JPEG images (image folders and shards): the header, a whole decode, and a
// region decode at a reduced DCT scale, as the training transform asks for.
#include "runtime/data/image_decode.h"
#include "tests/fuzz/fuzz_files.h"

namespace mix::fuzz {

const char* const kTargetName = "jpeg";

namespace {

void require_rgb(const data::RgbImage& img, const char* what) {
  if (img.width <= 0 || img.height <= 0 ||
      img.pixels.size() != static_cast<size_t>(img.width) * static_cast<size_t>(img.height) * 3)
    throw ContractBroken(std::string(what) + ": " + std::to_string(img.width) + " x " + std::to_string(img.height) +
                         " pixels held in " + std::to_string(img.pixels.size()) + " bytes");
}

}  // namespace

Outcome run_one(const std::string& bytes) {
  // The decoder reads bytes, not files; the name stands for the file in its errors.
  const std::string path = "fuzz-input.jpg";
  return refused_naming(path, [&] {
    const data::JpegHeader header = data::read_jpeg_header(bytes, path);
    // Inputs whose header claims a huge image are refused by libjpeg's own
    // limit or decode slowly; skip the big ones so that the fuzzer stays fast.
    if (static_cast<int64_t>(header.width) * header.height > (int64_t{1} << 22)) return;
    const data::RgbImage whole = data::decode_jpeg(bytes, path);
    require_rgb(whole, "the whole decode");

    // The centre half, at the scale the transform would choose for it.
    const data::DctScale scale = data::choose_dct_scale(whole.width / 2.0, whole.height / 2.0, 8, 8);
    const int sw = scale.apply(whole.width), sh = scale.apply(whole.height);
    const data::PixelRegion region{sw / 4, sh / 4, std::max(1, sw / 2), std::max(1, sh / 2)};
    const data::RgbImage part = data::decode_jpeg(bytes, path, scale, &region);
    require_rgb(part, "the region decode");
    if (part.x0 > region.x || part.y0 > region.y || part.x0 + part.width < region.x + region.width ||
        part.y0 + part.height < region.y + region.height)
      throw ContractBroken("the region decode does not cover the region asked for");
  });
}

}  // namespace mix::fuzz
