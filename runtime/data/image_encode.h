#pragma once
// Encoding 8-bit RGB into JPEG with libjpeg-turbo: what `mixbench
// make-images` writes synthetic image folders with, on a GPU node that has
// no Python imaging library.
#include <string>

#include "runtime/data/image_decode.h"

namespace mix::data {

/// The JPEG bytes of `img` (4:2:0 chroma, `quality` 1..100, as PIL's default
/// save). Throws mix::Error on a libjpeg failure.
std::string encode_jpeg(const RgbImage& img, int quality);

}  // namespace mix::data
