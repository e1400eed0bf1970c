// The pointwise convolution as one GEMM per pass (runtime/ops/conv_gemm.h,
// what --cublas-1x1-conv hands cuBLAS) against the CPU conv2d kernel: the
// formulation (which operand, which transposes, m, n and k, and for a strided
// convolution the gather or scatter of its sampled pixels) is checked here on
// the CPU through cpu::sgemm, whose argument order cuda::gemm shares, and the
// CPU twins of the GPU's copies; the cuBLAS runs are in test_cuda_conv_ops's
// [cuda] cases.
//
// The inputs are small integers, so every product and every sum is exact in
// FP32 (the largest |sum| here is far below 2^24): the GEMM must give the
// kernel's bits whatever order either sums in, and a wrong operand, transpose
// or extent cannot hide in a tolerance.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "models/model.h"
#include "runtime/core/random.h"
#include "runtime/ops/conv_gemm.h"
#include "runtime/ops/gemm.h"
#include "runtime/ops/transpose2_shapes.h"
#include "tests/unit/cuda_compare.h"

using namespace mix;
using namespace mix::testing;

namespace {

struct PointwiseCase {
  const char* name;
  int64_t n, c, h, w, oc, dilation;
  int64_t stride_h = 1, stride_w = 1;
};

// Odd extents everywhere, so that swapping any two of m, n and k changes a shape.
const PointwiseCase kCases[] = {
    {"one image", 1, 3, 2, 5, 4, 1},
    {"a batch, more outputs than inputs", 3, 5, 7, 6, 11, 1},
    {"fewer outputs than inputs", 2, 12, 3, 3, 5, 1},
    {"dilation 2 (no gaps in a 1x1 window)", 2, 4, 5, 3, 6, 2},
    {"stride 2, even extents (ResNet's shortcuts)", 2, 6, 8, 6, 10, 1, 2, 2},
    {"stride 2, odd extents (the last row and column sampled)", 2, 5, 7, 5, 3, 1, 2, 2},
    {"strides 3 and 1 (rows skipped, columns not)", 3, 4, 7, 5, 6, 1, 3, 1},
    {"stride 2 and dilation 3", 1, 3, 5, 6, 7, 3, 2, 2},
};

// Integers in [-range, range] as f32: exact products and sums.
Tensor small_integers(const Shape& shape, uint64_t seed, int range) {
  Tensor t = Tensor::empty(shape, DType::f32);
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = static_cast<float>(static_cast<int>(rng.next_u64() % (2 * range + 1)) - range);
  return t;
}

std::map<std::string, Attr> pointwise_attrs(const PointwiseCase& k, const std::string& format = "NHWC") {
  return {{"strides", std::vector<int64_t>{k.stride_h, k.stride_w}},
          {"paddings", std::vector<int64_t>{0, 0}},
          {"dilations", std::vector<int64_t>{k.dilation, k.dilation}},
          {"groups", int64_t{1}},
          {"data_format", format}};
}

// What `pass` writes (y forward, x backward data, w backward filter), from
// cpu::sgemm running conv_gemm's description over x, w and y, as the CUDA
// launcher (runtime/ops/cuda/conv2d.cu) runs it: with a stride, over the
// sampled pixels, gathered from x before or scattered into a zeroed x after.
Tensor through_gemm(ConvPass pass, const ConvDims& d, Tensor x, Tensor w, Tensor y) {
  auto run = [&](void* pixels) {
    const ConvGemm g = conv_gemm(pass, d, pixels, w.raw(), y.raw());
    cpu::sgemm(g.trans_a, g.trans_b, g.m, g.n, g.k, 1.f, static_cast<const float*>(g.a), static_cast<const float*>(g.b),
               0.f, static_cast<float*>(g.c));
  };
  if (conv_samples_every_pixel(d)) {
    run(x.raw());
  } else {
    Tensor sampled = Tensor::empty({d.n, d.oh, d.ow, d.c}, DType::f32);
    const fn::TransposePlan view = sampled_pixels(d);
    const size_t es = sizeof(float);
    if (pass == ConvPass::backward_data) {
      run(sampled.raw());
      std::memset(x.raw(), 0, x.bytes());
      transpose_rules::scatter_cpu(sampled.raw(), x.raw(), view, sampled.numel(), es);
    } else {
      transpose_rules::gather_cpu(x.raw(), sampled.raw(), view, sampled.numel(), es);
      run(sampled.raw());
    }
  }
  return pass == ConvPass::forward ? y : pass == ConvPass::backward_data ? x : w;
}

void expect_same_floats(const Tensor& got, const Tensor& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  CHECK(got.to_floats() == want.to_floats());
}

}  // namespace

TEST_CASE("a 1x1 channels-last convolution is one GEMM per pass (and a copy if strided), bit for bit with conv2d",
          "[conv2d][gemm]") {
  uint64_t seed = 40;
  for (const PointwiseCase& k : kCases) {
    INFO(k.name);
    const Tensor x = small_integers({k.n, k.h, k.w, k.c}, seed++, 3);
    const Tensor filter = small_integers({k.oc, k.c, 1, 1}, seed++, 2);
    const Tensor dy = small_integers({k.n, (k.h - 1) / k.stride_h + 1, (k.w - 1) / k.stride_w + 1, k.oc}, seed++, 3);
    const OpDesc fwd =
        make_op("conv2d", {{"Input", {"x"}}, {"Filter", {"w"}}}, {{"Output", {"y"}}}, pointwise_attrs(k));
    const ConvDims d = conv_dims(fwd, x.shape(), filter.shape());
    REQUIRE(conv_runs_as_gemm(d));
    CHECK(conv_samples_every_pixel(d) == (k.stride_h == 1 && k.stride_w == 1));

    const auto y = run_on({fwd, {{"x", x}, {"w", filter}}}, cpu_device(), {"y"}).at("y");
    const Tensor y_gemm =
        through_gemm(ConvPass::forward, d, x.clone(), filter.clone(), Tensor::empty(y.shape(), DType::f32));
    expect_same_floats(y_gemm, y, "forward");

    const OpDesc bwd = make_op("conv2d_grad", {{"Input", {"x"}}, {"Filter", {"w"}}, {"Output@GRAD", {"dy"}}},
                               {{"Input@GRAD", {"dx"}}, {"Filter@GRAD", {"dw"}}}, pointwise_attrs(k));
    const auto grads = run_on({bwd, {{"x", x}, {"w", filter}, {"dy", dy}}}, cpu_device(), {"dx", "dw"});
    // Filled with a value the scatter must overwrite where a stride skips pixels.
    const Tensor dx_gemm =
        through_gemm(ConvPass::backward_data, d, Tensor::from_floats(x.shape(), std::vector<float>(x.numel(), 7.f)),
                     filter.clone(), dy.clone());
    expect_same_floats(dx_gemm, grads.at("dx"), "backward data");
    const Tensor dw_gemm =
        through_gemm(ConvPass::backward_filter, d, x.clone(), Tensor::empty(filter.shape(), DType::f32), dy.clone());
    expect_same_floats(dw_gemm, grads.at("dw"), "backward filter");
  }
}

TEST_CASE("only pointwise, unpadded, ungrouped channels-last convolutions are GEMMs; strided ones sample pixels",
          "[conv2d][gemm]") {
  const PointwiseCase k{"", 2, 8, 6, 6, 8, 1};
  auto dims = [&](std::map<std::string, Attr> attrs, Shape filter) {
    const OpDesc op = make_op("conv2d", {{"Input", {"x"}}, {"Filter", {"w"}}}, {{"Output", {"y"}}}, std::move(attrs));
    const bool last = std::get<std::string>(op.attrs.at("data_format")) == "NHWC";
    return conv_dims(op, last ? Shape{k.n, k.h, k.w, k.c} : Shape{k.n, k.c, k.h, k.w}, filter);
  };
  const Shape pointwise{k.oc, k.c, 1, 1};
  CHECK(conv_runs_as_gemm(dims(pointwise_attrs(k), pointwise)));
  CHECK(conv_samples_every_pixel(dims(pointwise_attrs(k), pointwise)));
  CHECK_FALSE(conv_runs_as_gemm(dims(pointwise_attrs(k, "NCHW"), pointwise)));  // pixels are not rows
  auto with = [&](const std::string& attr, Attr value) {
    auto a = pointwise_attrs(k);
    a[attr] = std::move(value);
    return a;
  };
  for (const std::vector<int64_t>& strides : {std::vector<int64_t>{2, 2}, std::vector<int64_t>{1, 2}}) {
    const ConvDims d = dims(with("strides", strides), pointwise);
    CHECK(conv_runs_as_gemm(d));
    CHECK_FALSE(conv_samples_every_pixel(d));
    // The view's first element past each stride is the pixel the stride lands on.
    const fn::TransposePlan view = sampled_pixels(d);
    CHECK(view.src_offset(d.c) == strides[1] * d.c);               // next column sampled
    CHECK(view.src_offset(d.ow * d.c) == strides[0] * d.w * d.c);  // next row sampled
    CHECK(view.src_offset(d.oh * d.ow * d.c) == d.h * d.w * d.c);  // next image
  }
  CHECK_FALSE(conv_runs_as_gemm(dims(with("paddings", std::vector<int64_t>{1, 1}), pointwise)));
  CHECK_FALSE(conv_runs_as_gemm(dims(with("paddings", std::vector<int64_t>{0, 1}), pointwise)));
  CHECK_FALSE(conv_runs_as_gemm(dims(with("groups", int64_t{2}), {k.oc, k.c / 2, 1, 1})));
  CHECK_FALSE(conv_runs_as_gemm(dims(pointwise_attrs(k), {k.oc, k.c, 3, 3})));
  CHECK_FALSE(conv_runs_as_gemm(dims(pointwise_attrs(k), {k.oc, k.c, 1, 3})));
  CHECK_FALSE(conv_runs_as_gemm(dims(pointwise_attrs(k), {k.oc, k.c, 3, 1})));
}

TEST_CASE("ResNet-50 channels last: 36 of its 53 convolutions are GEMMs, 3 of them strided", "[conv2d][gemm][resnet]") {
  // Each bottleneck's first and last 1x1 layers (16 blocks) and the first
  // stage's shortcut (1x1, stride 1), and the other three shortcuts (1x1,
  // stride 2); the stem and the 3x3 layers stay with the convolution
  // libraries. The narrow bottleneck ResNet of test_cuda_train_step's
  // --cublas-1x1-conv case: its two blocks' 1x1 pairs and both shortcuts (the
  // second strided), 6 of 9.
  struct Case {
    const char* name;
    models::ResNetConfig cfg;
    int64_t convs, gemms, strided;
  };
  models::ResNetConfig narrow = models::resnet_preset("resnet-small");
  narrow.bottleneck = true;
  narrow.width = 4;
  narrow.blocks = {1, 1};
  narrow.image_size = 16;
  for (Case c :
       {Case{"resnet50", models::resnet_preset("resnet50"), 53, 36, 3}, Case{"narrow bottleneck", narrow, 9, 6, 1}})
    for (bool channels_last : {false, true}) {
      INFO(c.name << (channels_last ? " NHWC" : " NCHW"));
      c.cfg.channels_last = channels_last;
      const models::Model m = models::build_resnet(c.cfg, c.name);
      int64_t convs = 0, gemms = 0, strided = 0;
      for (const OpDesc& op : m.program.ops()) {
        if (op.type != "conv2d") continue;
        ++convs;
        const Shape& input = m.program.var(op.in("Input")).shape;
        const ConvDims d = conv_dims(op, input, m.program.var(op.in("Filter")).shape);
        gemms += conv_runs_as_gemm(d);
        strided += conv_runs_as_gemm(d) && !conv_samples_every_pixel(d);
      }
      CHECK(convs == c.convs);
      CHECK(gemms == (channels_last ? c.gemms : 0));
      CHECK(strided == (channels_last ? c.strided : 0));
    }
}
