// The image-folder data set: JPEG decoding, torchvision's transforms checked
// against torchvision itself (Debian's python3-torchvision on the same files),
// RandomResizedCrop's boxes, worker-count independence, bad files and the
// cached listing.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>

#include "runtime/core/check.h"
#include "runtime/data/image_decode.h"
#include "runtime/data/image_encode.h"
#include "runtime/data/image_folder.h"
#include "runtime/data/image_shards.h"
#include "runtime/data/image_transforms.h"
#include "tests/unit/temp_files.h"

using namespace mix;
using namespace mix::data;
namespace fs = std::filesystem;
using mix::test::TempDir;

namespace {

// Writes JPEGs with PIL: IMAGES lists (name, width, height, mode); smooth
// gradients plus noise, so that resampling errors would show.
const char* kMakeImages = R"PY(
import sys, numpy as np
from PIL import Image
out = sys.argv[1]
rng = np.random.default_rng(0)
for spec in sys.argv[2:]:
    name, w, h, mode = spec.split(":")
    w, h = int(w), int(h)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255.0 / w, yy * 255.0 / h, (xx + yy) * 127.0 / (w + h)], -1)
    img = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
    im = Image.fromarray(img, "RGB")
    if mode in ("L", "RGBA", "P"):
        im = im.convert(mode)
    if mode == "RGBA":  # an alpha channel that varies, which decoding must drop, not blend
        a = np.asarray(im).copy()
        a[..., 3] = (xx * 255 // max(w - 1, 1)).astype(np.uint8)
        im = Image.fromarray(a, "RGBA")
    # RGB444: no chroma subsampling (PIL's default is 4:2:0).
    im.save(f"{out}/{name}", quality=90, **({"subsampling": 0} if mode == "RGB444" else {}))
)PY";

// torchvision on the same files: PIL's decoded pixels (RGB uint8), the
// evaluation transform, and resized_crop + hflip for boxes given by the test.
const char* kTorchvision = R"PY(
import sys, numpy as np, torch
from PIL import Image
import torchvision.transforms as T
import torchvision.transforms.functional as F
out, size = sys.argv[1], int(sys.argv[2])
norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
ev = T.Compose([T.Resize(round(size * 256 / 224)), T.CenterCrop(size), T.ToTensor(), norm])
for line in open(f"{out}/boxes.txt"):
    name, x, y, w, h, flip = line.split()
    im = Image.open(f"{out}/{name}").convert("RGB")
    np.asarray(im, dtype=np.uint8).tofile(f"{out}/{name}.rgb")
    ev(im).numpy().astype(np.float32).tofile(f"{out}/{name}.eval")
    c = F.resized_crop(im, int(y), int(x), int(h), int(w), [size, size], T.InterpolationMode.BILINEAR)
    if flip == "1":
        c = F.hflip(c)
    norm(F.to_tensor(c)).numpy().astype(np.float32).tofile(f"{out}/{name}.crop")
)PY";

std::vector<float> read_floats(const std::string& path) {
  const std::string b = mix::test::read_bytes(path);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

void make_images(const TempDir& d, const std::string& dir, const std::string& specs) {
  REQUIRE(mix::test::run_python(d, kMakeImages, dir + " " + specs) == 0);
}

// One normalised 8-bit level, at the smallest std (the largest step).
constexpr float kLevel = 1.0f / 255.0f / 0.224f;

}  // namespace

// Decodes a JPEG or, by its name, a PNG.
RgbImage decode_by_name(const std::string& bytes, const std::string& name) {
  return has_png_name(name) ? decode_png(bytes, name) : decode_jpeg(bytes, name);
}

TEST_CASE("transforms match torchvision on the same JPEGs and PNGs", "[image_folder]") {
  TempDir d;
  const std::string dir = d.path.string();
  // A photo-sized colour image, a small one, a grayscale one, a very wide one;
  // PNGs in RGB, with alpha, with a palette and in grayscale.
  make_images(d, dir,
              "big.jpg:500:375:RGB small.jpg:45:40:RGB gray.jpg:60:80:L wide.jpg:300:40:RGB pic.png:90:70:RGB "
              "alpha.png:40:30:RGBA pal.png:36:36:P grayp.PNG:30:45:L");
  const int64_t size = 32;
  ImageTransformOptions opt;
  opt.size = size;
  opt.dct_scaling = false;  // torchvision decodes at full size
  const std::vector<std::string> names = {"big.jpg", "small.jpg", "gray.jpg",  "wide.jpg",
                                          "pic.png", "alpha.png", "pal.png", "grayp.PNG"};
  std::vector<CropBox> boxes;
  std::vector<bool> flips;
  {
    std::ofstream b(d.file("boxes.txt"));
    for (size_t i = 0; i < names.size(); ++i) {
      const RgbImage h = decode_by_name(mix::test::read_bytes(d.file(names[i])), names[i]);
      Rng rng(100 + i);
      boxes.push_back(random_resized_crop_box(h.width, h.height, opt.crop_scale, opt.crop_ratio, rng));
      flips.push_back(i % 2 == 0);
      b << names[i] << " " << boxes[i].x << " " << boxes[i].y << " " << boxes[i].width << " " << boxes[i].height
        << " " << (flips[i] ? 1 : 0) << "\n";
    }
  }
  REQUIRE(mix::test::run_python(d, kTorchvision, dir + " " + std::to_string(size)) == 0);
  const size_t n = 3 * size * size;
  for (size_t i = 0; i < names.size(); ++i) {
    INFO(names[i]);
    const std::string bytes = mix::test::read_bytes(d.file(names[i]));
    // 1. The decoders: PIL's libjpeg and ours. Debian builds both
    // on libjpeg-turbo with the same (accurate) IDCT and fancy upsampling, so
    // they agree exactly here; elsewhere another libjpeg may differ by a level
    // or two. PNG is lossless: the same pixels, alpha dropped as PIL does.
    const RgbImage ours = decode_by_name(bytes, names[i]);
    const std::string pil = mix::test::read_bytes(d.file(names[i] + ".rgb"));
    REQUIRE(pil.size() == ours.pixels.size());
    int decode_diff = 0;
    for (size_t k = 0; k < pil.size(); ++k)
      decode_diff = std::max(decode_diff, std::abs(int(uint8_t(pil[k])) - int(ours.pixels[k])));
    CHECK(decode_diff <= (has_png_name(names[i]) ? 0 : 2));
    // 2. The resampling alone, on PIL's own pixels: it mirrors PIL's fixed
    // point, so the bits match up to the float rounding of Normalize.
    RgbImage pil_img{ours.width, ours.height, std::vector<uint8_t>(pil.begin(), pil.end())};
    std::vector<uint8_t> pixels(n);
    std::vector<float> out(n);
    const ResizePlan p = eval_resize_plan(ours.width, ours.height, eval_resize_size(size), size);
    resample_crop(pil_img, CropBox{0, 0, double(ours.width), double(ours.height)}, p.out_w, p.out_h, p.crop_x,
                  p.crop_y, size, false, pixels.data());
    normalize_image(pixels.data(), size, opt, out.data());
    CHECK(max_abs_diff(out, read_floats(d.file(names[i] + ".eval"))) < 1e-5f);
    resample_crop(pil_img, boxes[i], size, size, 0, 0, size, flips[i], pixels.data());
    normalize_image(pixels.data(), size, opt, out.data());
    CHECK(max_abs_diff(out, read_floats(d.file(names[i] + ".crop"))) < 1e-5f);
    // 3. The whole transform from the file: within one level per level of
    // decoder difference, plus one for a rounding that the difference tips.
    Rng unused(0);
    transform_image(bytes, names[i], /*train=*/false, opt, unused, pixels.data());
    normalize_image(pixels.data(), size, opt, out.data());
    CHECK(max_abs_diff(out, read_floats(d.file(names[i] + ".eval"))) <= (decode_diff + 1) * kLevel + 1e-5f);
  }
}

TEST_CASE("DCT-scaled decoding keeps the crop in place", "[image_folder]") {
  TempDir d;
  make_images(d, d.path.string(), "big.jpg:800:600:RGB");
  const std::string bytes = mix::test::read_bytes(d.file("big.jpg"));
  CHECK(choose_dct_scale(800, 600, 32, 32).factor() == Approx(1.0 / 8));  // 100 x 75 still covers 32 x 32
  CHECK(choose_dct_scale(800, 600, 300, 300).factor() == Approx(4.0 / 8));
  CHECK(choose_dct_scale(800, 600, 700, 700).factor() == Approx(1.0));
  ImageTransformOptions full, scaled;
  full.size = scaled.size = 64;
  full.dct_scaling = false;
  std::vector<uint8_t> a(3 * 64 * 64), b(a.size());
  for (bool train : {false, true}) {
    Rng r1(7), r2(7);
    transform_image(bytes, "big.jpg", train, full, r1, a.data());
    transform_image(bytes, "big.jpg", train, scaled, r2, b.data());
    // The scaled IDCT averages differently from PIL's filter, but a shifted or
    // mis-sized crop would differ by far more (the image is a gradient).
    double mean = 0;
    for (size_t i = 0; i < a.size(); ++i) mean += std::abs(int(a[i]) - int(b[i]));
    mean /= a.size();
    INFO("train " << train << ": mean |full - scaled| in levels " << mean);
    CHECK(mean < 4);
  }
}

TEST_CASE("A region decode gives the pixels of the full decode", "[image_folder]") {
  // 4:2:0 chroma needs the rows and columns around a region to upsample its
  // edges: a region decode that got them wrong would differ at its border.
  TempDir d;
  make_images(d, d.path.string(), "a.jpg:301:203:RGB b.jpg:301:203:RGB444 c.jpg:301:203:L");
  for (const char* name : {"a.jpg", "b.jpg", "c.jpg"}) {
    const std::string bytes = mix::test::read_bytes(d.file(name));
    for (int n : {8, 5, 4, 1}) {
      const DctScale s{n, 8};
      const RgbImage full = decode_jpeg(bytes, name, s);
      CHECK(full.width == s.apply(301));
      for (PixelRegion r : {PixelRegion{0, 0, 10, 10}, PixelRegion{17, 9, 33, 41}, PixelRegion{31, 23, 1, 1},
                            PixelRegion{full.width - 20, full.height - 7, 20, 7}, PixelRegion{5, 1, 200, 150}}) {
        r.width = std::min(r.width, full.width - r.x);
        r.height = std::min(r.height, full.height - r.y);
        if (r.x < 0 || r.y < 0 || r.width < 1 || r.height < 1) continue;
        INFO(name << " at " << n << "/8, region " << r.x << "," << r.y << " " << r.width << "x" << r.height);
        const RgbImage part = decode_jpeg(bytes, name, s, &r);
        // libjpeg may widen the columns to a block boundary, never narrow them.
        REQUIRE(part.x0 <= r.x);
        REQUIRE(part.x0 + part.width >= r.x + r.width);
        REQUIRE(part.y0 == r.y);
        REQUIRE(part.height == r.height);
        int differ = 0;
        for (int y = 0; y < r.height; ++y)
          for (int x = r.x; x < r.x + r.width; ++x)
            for (int c = 0; c < 3; ++c)
              differ += part.pixels[(static_cast<size_t>(y) * part.width + x - part.x0) * 3 + c] !=
                        full.pixels[(static_cast<size_t>(r.y + y) * full.width + x) * 3 + c];
        CHECK(differ == 0);
      }
    }
    // The file is read to its end whatever the region: a file cut short below
    // the region is as much an error as one cut inside it.
    const std::string cut = bytes.substr(0, bytes.size() * 9 / 10);
    const PixelRegion top{0, 0, 10, 10};
    CHECK_THROWS_WITH(decode_jpeg(cut, name, DctScale{}, &top), Catch::Contains("corrupt or truncated JPEG"));
  }
}

TEST_CASE("encode_jpeg writes a JPEG that decodes back to its pixels", "[image_folder]") {
  RgbImage img;
  img.width = 64, img.height = 40;
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x)
      for (int c = 0; c < 3; ++c) img.pixels.push_back(static_cast<uint8_t>(c == 0 ? 4 * x : c == 1 ? 6 * y : 128));
  const std::string bytes = encode_jpeg(img, 95);
  const RgbImage back = decode_jpeg(bytes, "encoded.jpg");
  REQUIRE(back.width == 64);
  REQUIRE(back.height == 40);
  double mean = 0;
  for (size_t i = 0; i < img.pixels.size(); ++i) mean += std::abs(int(img.pixels[i]) - int(back.pixels[i]));
  mean /= img.pixels.size();
  // Quality 95 on smooth gradients loses about a level a pixel; a wrong row
  // stride or channel order would be off by tens.
  CHECK(mean < 3);
  CHECK_THROWS_WITH(encode_jpeg(RgbImage{}, 90), Catch::Contains("encode_jpeg"));
}

TEST_CASE("RandomResizedCrop boxes stay inside and repeat for a seed", "[image_folder]") {
  const std::array<double, 2> scale = {0.08, 1.0}, ratio = {3.0 / 4, 4.0 / 3};
  for (auto [w, h] : {std::pair{500, 375}, {32, 32}, {28, 28}, {300, 40}, {7, 900}}) {
    for (uint64_t seed = 0; seed < 500; ++seed) {
      Rng a(seed), b(seed);
      const CropBox box = random_resized_crop_box(w, h, scale, ratio, a);
      const CropBox again = random_resized_crop_box(w, h, scale, ratio, b);
      CHECK((box.x == again.x && box.y == again.y && box.width == again.width && box.height == again.height));
      REQUIRE(box.width >= 1);
      REQUIRE(box.height >= 1);
      REQUIRE(box.x >= 0);
      REQUIRE(box.y >= 0);
      REQUIRE(box.x + box.width <= w);
      REQUIRE(box.y + box.height <= h);
      REQUIRE(box.x == std::floor(box.x));
    }
  }
  // No draw can fit (the area fraction is above 1): the central box at the
  // nearest allowed ratio. 100 x 10 is wider than 4/3: 13 x 10 at x = (100 - 13) / 2.
  Rng r(1);
  const CropBox c = random_resized_crop_box(100, 10, {2.0, 3.0}, ratio, r);
  CHECK(c.x == 43);
  CHECK(c.y == 0);
  CHECK(c.width == 13);
  CHECK(c.height == 10);
  const CropBox tall = random_resized_crop_box(10, 100, {2.0, 3.0}, ratio, r);
  CHECK(tall.width == 10);
  CHECK(tall.height == 13);  // round(10 / (3/4))
  CHECK(tall.y == 43);
}

TEST_CASE("evaluation resize plan follows torchvision's rounding", "[image_folder]") {
  CHECK(eval_resize_size(224) == 256);
  CHECK(eval_resize_size(32) == 37);
  const ResizePlan p = eval_resize_plan(500, 375, 256, 224);
  CHECK(p.out_w == 341);  // int(256 * 500 / 375)
  CHECK(p.out_h == 256);
  CHECK(p.crop_x == 58);  // round(58.5) is 58, to even
  CHECK(p.crop_y == 16);
}

namespace {

// DIR/train/{a,b,c} and DIR/val/{a,b,c}, a few 40 x 30 JPEGs each.
std::string make_folder(const TempDir& d, int per_class = 4) {
  const std::string root = d.file("data");
  for (const char* split : {"train", "val"})
    for (const char* cls : {"a", "b", "c"}) {
      const std::string dir = root + "/" + split + "/" + cls;
      fs::create_directories(dir);
      std::string specs;
      for (int i = 0; i < per_class; ++i) specs += " img" + std::to_string(i) + ".jpg:40:30:RGB";
      make_images(d, dir, specs);
    }
  return root;
}

struct Batch {
  Tensor x, y;
};
Batch read_all(const ExampleSource& s, int64_t epoch) {
  std::vector<int64_t> idx(s.size());
  for (int64_t i = 0; i < s.size(); ++i) idx[i] = (i * 7) % s.size();  // any order
  Shape xs = s.example_shape();
  xs.insert(xs.begin(), s.size());
  Batch b{Tensor::empty(xs, s.input_dtype()), Tensor::empty({s.size()}, DType::i64)};
  s.read(idx, 0, s.size(), epoch, b.x, b.y);
  return b;
}

// Whether two tensors hold the same bytes.
bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

// Checks that two sources give the same examples and labels, bit for bit, in
// each of `epochs`. The INFO names the split and epoch: a failure's line is
// this function's, which alone would not tell the calls apart.
void check_same_examples(const char* split, const ExampleSource& a, const ExampleSource& b,
                         std::initializer_list<int64_t> epochs) {
  for (int64_t epoch : epochs) {
    INFO(split << ", epoch " << epoch);
    const Batch x = read_all(a, epoch), y = read_all(b, epoch);
    CHECK(same_bytes(x.x, y.x));
    CHECK(same_bytes(x.y, y.y));
  }
}

}  // namespace

TEST_CASE("image folder: labels by train's sorted classes, 1 and 4 workers give the same bits", "[image_folder]") {
  TempDir d;
  const std::string root = make_folder(d, 5);
  ImageFolderOptions o1, o4;
  o1.transform.size = o4.transform.size = 24;
  o1.workers = 1;
  o4.workers = 4;
  const TrainTest a = load_image_folder(root, o1), b = load_image_folder(root, o4);
  REQUIRE(a.train.size() == 15);
  REQUIRE(a.test.size() == 15);
  CHECK(a.train.num_classes == 3);
  // 8-bit RGB pixels, channels last: the model normalises them (image_normalize).
  CHECK(a.train.example_shape() == Shape{24, 24, 3});
  CHECK(a.train.input_dtype() == DType::u8);
  CHECK(a.test.example_shape() == Shape{24, 24, 3});
  CHECK(a.test.input_dtype() == DType::u8);
  check_same_examples("train", *a.train.source, *b.train.source, {0, 3});
  // Another epoch draws other crops; evaluation has none to draw.
  const Batch e0 = read_all(*a.train.source, 0), e1 = read_all(*a.train.source, 1);
  CHECK_FALSE(same_bytes(e0.x, e1.x));
  const Batch v0 = read_all(*a.test.source, 0), v1 = read_all(*a.test.source, 1);
  CHECK(same_bytes(v0.x, v1.x));
  // Example i * 7 % 15 of 5 per class: class (i * 7 % 15) / 5.
  for (int64_t i = 0; i < 15; ++i) CHECK(v0.y.data<int64_t>()[i] == (i * 7 % 15) / 5);
}

TEST_CASE("bad images: an error naming the file, or replaced under --skip-bad-images", "[image_folder]") {
  TempDir d;
  const std::string root = make_folder(d, 3);
  const std::string good = mix::test::read_bytes(root + "/train/a/img0.jpg");
  make_images(d, d.path.string(), "real.png:40:30:RGB");
  const std::string png = mix::test::read_bytes(d.file("real.png"));
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"empty.jpg", ""},                                     // zero bytes
      {"renamed.jpg", png},                                  // a PNG with a .jpg name
      {"truncated.jpg", good.substr(0, good.size() / 2)},   // cut short
      {"corrupt.jpg", good.substr(0, 200) + std::string(good.size() - 200, '\x55')},  // scan data overwritten
      {"jpeg.png", good},                                    // a JPEG with a .png name
      {"truncated.png", png.substr(0, png.size() * 2 / 3)},  // a PNG cut short
      {"empty.png", ""},
  };
  for (const auto& [name, bytes] : bad) {
    INFO(name);
    const std::string path = root + "/train/b/" + name;
    mix::test::write_bytes(path, bytes);
    ImageFolderOptions o;
    o.transform.size = 16;
    o.fallback_cache_dir = d.file("cache");
    const TrainTest t = load_image_folder(root, o);
    int64_t bad_index = -1;
    const ImageFolderIndex idx = list_image_folder(root + "/train", o.fallback_cache_dir);
    for (size_t i = 0; i < idx.files.size(); ++i)
      if (idx.files[i] == "b/" + name) bad_index = static_cast<int64_t>(i);
    REQUIRE(bad_index >= 0);
    Tensor x = Tensor::empty({1, 16, 16, 3}, DType::u8), y = Tensor::empty({1}, DType::i64);
    try {
      t.train.source->read({bad_index}, 0, 1, 0, x, y);
      FAIL("no error for " << name);
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::Contains(path));
      if (name == "renamed.jpg") CHECK_THAT(e.what(), Catch::Contains("rename it .png"));
      if (name == "jpeg.png") CHECK_THAT(e.what(), Catch::Contains("rename it .jpg"));
      if (name == "truncated.png") CHECK_THAT(e.what(), Catch::Contains("corrupt or truncated PNG"));
    }
    o.skip_bad_images = true;
    const TrainTest s = load_image_folder(root, o);
    s.train.source->read({bad_index}, 0, 1, 0, x, y);
    // The next file in the listing: img0 of b for names before "img", else c's first.
    CHECK(y.data<int64_t>()[0] == (name < std::string("img") ? 1 : 2));
    fs::remove(path);
  }
}

TEST_CASE("image folder errors name the folder", "[image_folder]") {
  TempDir d;
  const std::string root = make_folder(d, 1);
  ImageFolderOptions o;
  o.fallback_cache_dir = d.file("cache");
  fs::create_directories(root + "/val/zebra");
  make_images(d, root + "/val/zebra", "z.jpg:8:8:RGB");
  CHECK_THROWS_WITH(load_image_folder(root, o), Catch::Contains(root + "/val/zebra") && Catch::Contains("zebra"));
  fs::remove_all(root + "/val/zebra");
  fs::create_directories(root + "/train/empty");
  CHECK_THROWS_WITH(load_image_folder(root, o), Catch::Contains(root + "/train/empty") && Catch::Contains("empty"));
  fs::remove_all(root + "/train/empty");
  fs::remove_all(root + "/val");
  CHECK_THROWS_WITH(load_image_folder(root, o), Catch::Contains(root + "/val"));
}

TEST_CASE("the listing is cached and walked again when a folder changes", "[image_folder]") {
  TempDir d;
  const std::string root = make_folder(d, 2);
  // Folders changed in the last two seconds are not cached (their clock's tick
  // could hide a later change); age them instead of sleeping.
  auto age = [&] {
    const auto old = fs::file_time_type::clock::now() - std::chrono::seconds(60);
    for (const auto& e : fs::recursive_directory_iterator(root))
      if (e.is_directory()) fs::last_write_time(e.path(), old);
    fs::last_write_time(root + "/train", old);
  };
  age();
  const ImageFolderIndex first = list_image_folder(root + "/train");
  CHECK_FALSE(first.from_cache);
  CHECK(first.cache_file == root + "/.mixtrain-index-train.txt");
  const ImageFolderIndex second = list_image_folder(root + "/train");
  CHECK(second.from_cache);
  CHECK(second.files == first.files);
  CHECK(second.class_of == first.class_of);
  CHECK(second.classes == first.classes);
  // A new image changes its class folder's time: the next start walks again and sees it.
  mix::test::write_bytes(root + "/train/c/new.jpg", mix::test::read_bytes(root + "/train/c/img0.jpg"));
  const ImageFolderIndex third = list_image_folder(root + "/train");
  CHECK_FALSE(third.from_cache);
  CHECK(third.files.size() == first.files.size() + 1);
}

TEST_CASE("a damaged listing cache is walked again, never an error or a class out of range", "[image_folder]") {
  // Found by the image_index fuzz target (tests/fuzz/): a number that did not
  // parse threw std::invalid_argument out of the listing, and a class index
  // past the class lines was taken as a label.
  TempDir d;
  const std::string root = make_folder(d, 2);
  const auto old = fs::file_time_type::clock::now() - std::chrono::seconds(60);
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_directory()) fs::last_write_time(e.path(), old);
  fs::last_write_time(root + "/train", old);
  const ImageFolderIndex walked = list_image_folder(root + "/train");
  const std::string cache = mix::test::read_bytes(walked.cache_file);
  REQUIRE(list_image_folder(root + "/train").from_cache);
  const size_t file_line = cache.find("\nfile 0 ");
  const size_t dir_line = cache.find("\ndir ");
  REQUIRE(file_line != std::string::npos);
  REQUIRE(dir_line != std::string::npos);
  const std::string damaged[] = {
      cache.substr(0, file_line) + "\nfile x " + cache.substr(file_line + 8),                     // not a number
      cache.substr(0, file_line) + "\nfile 99999999999999999999 " + cache.substr(file_line + 8),  // past int64
      cache.substr(0, file_line) + "\nfile " + std::to_string(walked.classes.size()) + " " +
          cache.substr(file_line + 8),                                          // past the last class
      cache.substr(0, file_line) + "\nfile -1 " + cache.substr(file_line + 8),  // negative
      cache.substr(0, dir_line) + "\ndir 12ab" + cache.substr(dir_line + 5),    // a time that is not one
  };
  for (const std::string& text : damaged) {
    mix::test::write_bytes(walked.cache_file, text);
    const ImageFolderIndex again = list_image_folder(root + "/train");
    CHECK_FALSE(again.from_cache);
    CHECK(again.files == walked.files);
    CHECK(again.class_of == walked.class_of);
  }
}

namespace {

// scripts/make_image_shards.py's shards of the folder `root`, `per_shard`
// samples each, in the folder's order (--keep-order), so that index j is the
// same image in both.
std::string make_shards(const TempDir& d, const std::string& root, int per_shard) {
  const char* src = std::getenv("MIX_SOURCE_DIR");
  const fs::path source = src ? fs::path(src) : fs::absolute(fs::path(__FILE__)).parent_path().parent_path().parent_path();
  const std::string out = d.file("shards");
  const std::string cmd = std::string(mix::test::kPython) + " " + (source / "scripts/make_image_shards.py").string() +
                          " " + root + " " + out + " --per-shard " + std::to_string(per_shard) +
                          " --keep-order > /dev/null";
  REQUIRE(std::system(cmd.c_str()) == 0);
  return out;
}

}  // namespace

TEST_CASE("image shards give the image folder's examples, labels and crops, bit for bit", "[image_folder][shards]") {
  TempDir d;
  const std::string root = make_folder(d, 5);
  make_images(d, root + "/train/b", "z.png:44:33:RGB");  // a PNG member too: KEY.png in its shard
  const std::string shards = make_shards(d, root, 4);  // 16 samples: shards of 4, 4, 4 and 4
  ImageFolderOptions o;
  o.transform.size = 24;
  o.workers = 2;
  const TrainTest folder = load_image_folder(root, o), tar = load_image_shards(shards, o);
  REQUIRE(tar.train.size() == folder.train.size());
  REQUIRE(tar.test.size() == folder.test.size());
  CHECK(tar.train.num_classes == folder.train.num_classes);
  check_same_examples("train", *folder.train.source, *tar.train.source, {0, 2});
  check_same_examples("test", *folder.test.source, *tar.test.source, {0});
}

TEST_CASE("image shard errors name the shard and the sample", "[image_folder][shards]") {
  TempDir d;
  const std::string dir = d.file("shards");
  fs::create_directories(dir);
  ImageFolderOptions o;
  o.transform.size = 8;
  REQUIRE_THROWS_WITH(load_image_shards(dir, o), Catch::Contains(dir) && Catch::Contains("no train-*.tar shard"));
  // A sample without its .cls, and one whose .cls is not a class index.
  const char* writer = R"(
import io, sys, tarfile
def shard(path, members):
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as t:
        for name, data in members:
            info = tarfile.TarInfo(name); info.size = len(data); t.addfile(info, io.BytesIO(data))
shard(sys.argv[1] + "/train-000000.tar", [("k0.jpg", b"x"), ("k0.cls", b"1"), ("k1.jpg", b"y")])
shard(sys.argv[1] + "/val-000000.tar", [("v0.jpg", b"x"), ("v0.cls", b"cat")])
)";
  REQUIRE(mix::test::run_python(d, writer, dir) == 0);
  REQUIRE_THROWS_WITH(load_image_shards(dir, o), Catch::Contains("train-000000.tar") && Catch::Contains("'k1'") &&
                                                   Catch::Contains("no .cls member"));
  // The train shard mended: the bad .cls of val is next.
  std::string mended = writer;
  const std::string lone = ", (\"k1.jpg\", b\"y\")";
  mended.erase(mended.find(lone), lone.size());
  REQUIRE(mix::test::run_python(d, mended, dir) == 0);
  REQUIRE_THROWS_WITH(load_image_shards(dir, o), Catch::Contains("val-000000.tar") && Catch::Contains("'v0'") &&
                                                   Catch::Contains("'cat'"));
}
