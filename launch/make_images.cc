#include "launch/make_images.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "runtime/core/check.h"
#include "runtime/core/random.h"
#include "runtime/data/image_encode.h"
#include "runtime/data/worker_pool.h"

namespace mix::launch {
namespace fs = std::filesystem;

namespace {

// Image `index` of class `cls`: a coarse grid of colours near the class's
// colour, bilinearly enlarged to width x height, plus per-pixel noise.
data::RgbImage synthetic_image(int width, int height, int64_t cls, int64_t classes, uint64_t seed) {
  Rng rng(seed);
  constexpr int kGridW = 25, kGridH = 19;
  // Class colours spread around the hue circle.
  const double hue = 2.0 * M_PI * static_cast<double>(cls) / static_cast<double>(classes);
  const double base[3] = {128 + 80 * std::cos(hue), 128 + 80 * std::cos(hue - 2.0944), 128 + 80 * std::cos(hue + 2.0944)};
  float grid[kGridH][kGridW][3];
  for (auto& row : grid)
    for (auto& px : row)
      for (int c = 0; c < 3; ++c) px[c] = static_cast<float>(base[c] + 60.0 * (rng.uniform() - 0.5));
  data::RgbImage img;
  img.width = width;
  img.height = height;
  img.pixels.resize(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    const double gy = (y + 0.5) * (kGridH - 1) / height;
    const int y0 = std::min(static_cast<int>(gy), kGridH - 2);
    const double fy = gy - y0;
    for (int x = 0; x < width; ++x) {
      const double gx = (x + 0.5) * (kGridW - 1) / width;
      const int x0 = std::min(static_cast<int>(gx), kGridW - 2);
      const double fx = gx - x0;
      for (int c = 0; c < 3; ++c) {
        const double v = (1 - fy) * ((1 - fx) * grid[y0][x0][c] + fx * grid[y0][x0 + 1][c]) +
                         fy * ((1 - fx) * grid[y0 + 1][x0][c] + fx * grid[y0 + 1][x0 + 1][c]) + 8.0 * rng.normal();
        img.pixels[(static_cast<size_t>(y) * width + x) * 3 + c] =
            static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
      }
    }
  }
  return img;
}

// A class's folder name, c<k>.
std::string class_folder(int64_t k) {
  char name[32];
  std::snprintf(name, sizeof name, "c%lld", static_cast<long long>(k));
  return name;
}

}  // namespace

void run_make_images(const MakeImagesConfig& c) {
  MIX_CHECK(!c.out.empty(), "--out is required");
  MIX_CHECK(c.classes >= 1 && c.train >= c.classes && c.val >= c.classes,
            "--train " << c.train << " and --val " << c.val
                                             << " must each give every one of the " << c.classes
                                             << " classes an image at least");
  for (const char* split : {"train", "val"})
    for (int64_t k = 0; k < c.classes; ++k) fs::create_directories(fs::path(c.out) / split / class_folder(k));
  const int64_t total = c.train + c.val;
  std::atomic<int64_t> written{0}, bytes{0};
  data::WorkerPool pool(std::max(1, c.workers));
  const auto t0 = std::chrono::steady_clock::now();
  pool.parallel_for(total, [&](int64_t i) {
    const bool train = i < c.train;
    const int64_t cls = (train ? i : i - c.train) % c.classes;
    char name[32];
    std::snprintf(name, sizeof name, "%07lld.jpg", static_cast<long long>(i));
    const fs::path path = fs::path(c.out) / (train ? "train" : "val") / class_folder(cls) / name;
    if (fs::exists(path)) return;
    const std::string jpeg = data::encode_jpeg(
        synthetic_image(c.width, c.height, cls, c.classes, Rng::for_stream(c.seed, static_cast<uint64_t>(i)).next_u64()),
        c.quality);
    // Whole or absent: a file cut short by an interrupted call would be taken as written by the next.
    const fs::path tmp = path.string() + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary);
      f.write(jpeg.data(), static_cast<std::streamsize>(jpeg.size()));
      MIX_CHECK(f.good(), tmp.string() << ": cannot write (disk full or not writable?)");
    }
    fs::rename(tmp, path);
    ++written;
    bytes += static_cast<int64_t>(jpeg.size());
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "make-images: " << c.out << ": " << c.train << " train and " << c.val << " val images of " << c.width
            << " x " << c.height << " in " << c.classes << " classes; wrote " << written.load() << " ("
            << bytes.load() / 1024 << " KiB, " << bytes.load() / 1024 / std::max<int64_t>(1, written.load())
            << " KiB an image) in " << secs << " s, the rest were there" << std::endl;
}

}  // namespace mix::launch
