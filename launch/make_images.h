#pragma once
// `mixbench make-images`: a synthetic image folder in torchvision's
// ImageFolder layout (OUT/train/c<k>/*.jpg, OUT/val/c<k>/*.jpg), for the
// image readers' benchmarks where no Python imaging library is installed (a
// GPU node). Each image is a smooth colour field around its class's colour
// plus noise, so it compresses and decodes like a photograph, not like flat
// colour or static, and the classes can be told apart.
#include <cstdint>
#include <string>

namespace mix::launch {

struct MakeImagesConfig {
  std::string out;
  int64_t train = 2000, val = 200;  // images of each split, spread over the classes
  int64_t classes = 10;
  int width = 500, height = 375;  // ImageNet's typical size
  int quality = 90;
  uint64_t seed = 1;
  int workers = 1;  // encoding threads
};

/// Writes the folder (files that exist are kept, so a second call is cheap)
/// and prints what it wrote.
void run_make_images(const MakeImagesConfig& c);

}  // namespace mix::launch
