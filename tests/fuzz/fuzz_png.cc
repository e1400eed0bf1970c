// PNG images (image folders and shards).
#include "runtime/data/image_decode.h"
#include "tests/fuzz/fuzz_files.h"

namespace mix::fuzz {

const char* const kTargetName = "png";

Outcome run_one(const std::string& bytes) {
  // The decoder reads bytes, not files; the name stands for the file in its errors.
  const std::string path = "fuzz-input.png";
  return refused_naming(path, [&] {
    const data::RgbImage img = data::decode_png(bytes, path);
    if (img.width <= 0 || img.height <= 0 ||
        img.pixels.size() != static_cast<size_t>(img.width) * static_cast<size_t>(img.height) * 3)
      throw ContractBroken("a decode of " + std::to_string(img.width) + " x " + std::to_string(img.height) +
                           " pixels held in " + std::to_string(img.pixels.size()) + " bytes");
  });
}

}  // namespace mix::fuzz
