// The image_normalize op (runtime/ops/image_normalize.cc) on the CPU: the
// host's normalize_image (itself checked against torchvision in
// test_image_folder.cc) to the bit in both layouts, FP16/BF16 outputs the
// rounding of those FP32 values; its shape rules and refusals; no gradient
// asked of it; and a ResNet fed 8-bit pixels training to the bits of the same
// ResNet fed the host-normalised FP32 batches (the image readers' batches
// before and after they became u8), in FP32, AMP and BF16, channels first and
// last.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/core/random.h"
#include "runtime/data/image_transforms.h"
#include "runtime/ir/autodiff.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/data_format.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/train_steps.h"

using namespace mix;

namespace {

const std::vector<double> kMean = {0.485, 0.456, 0.406}, kStd = {0.229, 0.224, 0.225};

// Uniform random pixels [n, size, size, 3], with 0 and 255 at the start.
Tensor random_pixels(int64_t n, int64_t size, uint64_t seed) {
  Tensor t = Tensor::empty({n, size, size, 3}, DType::u8);
  Rng rng(seed);
  uint8_t* v = t.data<uint8_t>();
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<uint8_t>(rng.below(256));
  v[0] = 0;
  v[1] = 255;
  return t;
}

OpDesc normalize_op(const std::string& layout, DType out_dtype) {
  return make_op(
      "image_normalize", {{"X", {"x"}}}, {{"Out", {"out"}}},
      {{"mean", kMean}, {"std", kStd}, {"data_format", layout}, {"out_dtype", std::string(dtype_name(out_dtype))}});
}

Tensor run_normalize(const Tensor& pixels, const std::string& layout, DType out_dtype, Device device = cpu_device()) {
  return testing::run_ops_on({normalize_op(layout, out_dtype)}, {{"x", pixels}}, device, ExecEnv{}, {"out"})["out"];
}

// The host's normalisation of each image, f32 [n, 3, size, size]: what the
// image readers handed the trainer before their batches became u8.
Tensor host_normalized(const Tensor& pixels) {
  const int64_t n = pixels.dim(0), size = pixels.dim(1), per = 3 * size * size;
  data::ImageTransformOptions opt;
  opt.size = size;
  for (int c = 0; c < 3; ++c) {
    opt.mean[c] = static_cast<float>(kMean[c]);
    opt.stddev[c] = static_cast<float>(kStd[c]);
  }
  Tensor out = Tensor::empty({n, 3, size, size}, DType::f32);
  for (int64_t i = 0; i < n; ++i)
    data::normalize_image(pixels.data<uint8_t>() + i * per, size, opt, out.data<float>() + i * per);
  return out;
}

}  // namespace

TEST_CASE("image_normalize is the host's normalize_image, channels first or last, rounded once to f16 or bf16",
          "[image_normalize]") {
  const Tensor pixels = random_pixels(3, 7, 11);  // odd sizes: no dimension is a multiple of another
  const Tensor ref_nchw = host_normalized(pixels);
  const Tensor ref_nhwc = layout::channels_last_copy(ref_nchw);
  for (const std::string layout : {"NCHW", "NHWC"}) {
    const Tensor& ref = layout == "NCHW" ? ref_nchw : ref_nhwc;
    for (DType t : testing::kFloatTypes) {
      INFO(layout << " " << dtype_name(t));
      const Tensor out = run_normalize(pixels, layout, t);
      REQUIRE(out.shape() == ref.shape());
      REQUIRE(out.dtype() == t);
      // The same functor on the same bytes: the f32 values are the host's bits,
      // and a narrower output is their rounding to nearest even (one rounding).
      int64_t differ = 0;
      for (int64_t i = 0; i < ref.numel(); ++i) {
        const float r = ref.data<float>()[i];
        if (t == DType::f32)
          differ += float_bits(out.data<float>()[i]) != float_bits(r);
        else if (t == DType::f16)
          differ += out.data<half_t>()[i].bits != float_to_half_bits(r);
        else
          differ += out.data<bf16_t>()[i].bits != float_to_bf16_bits(r);
      }
      CHECK(differ == 0);
    }
  }
  // By hand, in double, for the first pixels (0 and 255 in channels 0 and 1):
  // (v / 255 - mean) / std within a few FP32 roundings.
  const Tensor out = run_normalize(pixels, "NHWC", DType::f32);
  for (int c = 0; c < 3; ++c) {
    const double v = pixels.data<uint8_t>()[c];
    const double want = (v / 255.0 - static_cast<float>(kMean[c])) / static_cast<float>(kStd[c]);
    CHECK(out.data<float>()[c] == Approx(want).epsilon(4e-7).margin(1e-6));
  }
  CHECK(out.data<float>()[0] == Approx(-0.485 / 0.229).epsilon(1e-6));
  CHECK(out.data<float>()[1] == Approx((1.0 - 0.456) / 0.224).epsilon(1e-6));
}

TEST_CASE("image_normalize's shapes and refusals", "[image_normalize]") {
  Program p;
  p.add_var(testing::var_desc("x", {-1, 5, 6, 3}, DType::u8));
  p.append_op(normalize_op("NCHW", DType::f16));
  CHECK(p.var("out").shape == Shape{-1, 3, 5, 6});
  CHECK(p.var("out").dtype == DType::f16);
  CHECK(p.var("out").stop_gradient);
  OpDesc nhwc = normalize_op("NHWC", DType::f32);
  nhwc.outputs["Out"] = {"out2"};
  p.append_op(nhwc);
  CHECK(p.var("out2").shape == Shape{-1, 5, 6, 3});
  CHECK(p.var("out2").dtype == DType::f32);
  // Defaults: NCHW, f32.
  OpDesc plain = make_op("image_normalize", {{"X", {"x"}}}, {{"Out", {"out3"}}}, {{"mean", kMean}, {"std", kStd}});
  p.append_op(plain);
  CHECK(p.var("out3").shape == Shape{-1, 3, 5, 6});
  CHECK(p.var("out3").dtype == DType::f32);

  auto refused = [](const Shape& x_shape, DType x_dtype, std::map<std::string, Attr> attrs) {
    Program q;
    q.add_var(testing::var_desc("x", x_shape, x_dtype));
    OpDesc op = make_op("image_normalize", {{"X", {"x"}}}, {{"Out", {"out"}}}, std::move(attrs));
    std::string what;
    try {
      q.append_op(op);
    } catch (const Error& e) {
      what = e.what();
    }
    return what;
  };
  const std::map<std::string, Attr> good = {{"mean", kMean}, {"std", kStd}};
  CHECK_THAT(refused({-1, 5, 5, 3}, DType::f32, good), Catch::Contains("u8 [N, H, W, C]"));
  CHECK_THAT(refused({-1, 3, 5, 5, 1}, DType::u8, good), Catch::Contains("u8 [N, H, W, C]"));
  CHECK_THAT(refused({-1, 5, 5, 5}, DType::u8, good), Catch::Contains("5 channels"));
  CHECK_THAT(refused({-1, 5, 5, 3}, DType::u8, {{"mean", std::vector<double>{0.5}}, {"std", kStd}}),
             Catch::Contains("one value per channel"));
  CHECK_THAT(refused({-1, 5, 5, 3}, DType::u8, {{"mean", kMean}, {"std", std::vector<double>{0.2, 0.0, 0.2}}}),
             Catch::Contains("channel 1") && Catch::Contains("nonzero"));
  std::map<std::string, Attr> ints = good;
  ints["out_dtype"] = std::string("i64");
  CHECK_THAT(refused({-1, 5, 5, 3}, DType::u8, ints), Catch::Contains("not a floating dtype"));
  std::map<std::string, Attr> layout = good;
  layout["data_format"] = std::string("CHWN");
  CHECK_THAT(refused({-1, 5, 5, 3}, DType::u8, layout), Catch::Contains("NCHW or NHWC"));
}

TEST_CASE("autodiff asks image_normalize for no gradient: the pixels are data", "[image_normalize]") {
  for (bool channels_last : {false, true}) {
    INFO((channels_last ? "NHWC" : "NCHW"));
    models::Model m = testing::narrow_resnet(channels_last, 8, false, testing::imagenet_pixels());
    REQUIRE(m.input_dtype == DType::u8);
    REQUIRE(m.example_shape == Shape{8, 8, 3});
    REQUIRE(m.program.ops().front().type == "image_normalize");
    const std::string normalized = m.program.ops().front().out("Out");
    seed_loss_gradient(m.program, m.loss);
    const BackwardResult b = append_backward(m.program, m.loss);
    CHECK_FALSE(b.param_grads.empty());
    for (size_t i = b.first_backward_op; i < m.program.ops().size(); ++i) {
      const OpDesc& op = m.program.ops()[i];
      INFO(op.type);
      for (const std::string& out : op.all_outputs()) {
        CHECK(out != grad_name(m.input));
        CHECK(out != grad_name(normalized));
      }
    }
  }
}

TEST_CASE("a ResNet fed 8-bit pixels trains to the bits of one fed the host-normalised batch", "[image_normalize]") {
  // The same pixels each step: one model normalises them itself
  // (image_normalize, into its layout and, folded, its AMP dtype), the other
  // is fed normalize_image's f32 NCHW batch (and transposes it, channels last).
  for (bool channels_last : {false, true})
    for (const auto& [precision, low] : {std::pair{"fp32", DType::f32}, {"amp", DType::f16}, {"bf16", DType::bf16}}) {
      INFO(precision << (channels_last ? " NHWC" : " NCHW"));
      testing::TrainOptions o;
      o.amp = low != DType::f32;
      o.low = low == DType::f32 ? DType::f16 : low;
      o.steps = 3;
      o.batch = 4;
      const testing::TrainedModel pixels =
          testing::train_steps(testing::narrow_resnet(channels_last, 8, false, testing::imagenet_pixels()), o);
      o.pixels_to_input = host_normalized;
      const testing::TrainedModel floats =
          testing::train_steps(testing::narrow_resnet(channels_last, 8, false, std::nullopt, 3), o);
      testing::expect_same_training(pixels, floats);
    }
}
