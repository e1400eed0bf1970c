// The pointwise convolution as one GEMM per pass (runtime/ops/conv_gemm.h,
// what --cublas-1x1-conv hands cuBLAS) against the CPU conv2d kernel: the
// formulation (which operand, which transposes, m, n and k) is checked here on
// the CPU through cpu::sgemm, whose argument order cuda::gemm shares; the
// cuBLAS runs are in test_cuda_conv_ops's [cuda] cases.
//
// The inputs are small integers, so every product and every sum is exact in
// FP32 (the largest |sum| here is far below 2^24): the GEMM must give the
// kernel's bits whatever order either sums in, and a wrong operand, transpose
// or extent cannot hide in a tolerance.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "models/model.h"
#include "runtime/ops/conv_gemm.h"
#include "runtime/ops/gemm.h"
#include "runtime/random.h"
#include "tests/unit/cuda_compare.h"

using namespace mix;
using namespace mix::testing;

namespace {

struct PointwiseCase {
  const char* name;
  int64_t n, c, h, w, oc, dilation;
};

/// Odd extents everywhere, so that swapping any two of m, n and k changes a shape.
const PointwiseCase kCases[] = {
    {"one image", 1, 3, 2, 5, 4, 1},
    {"a batch, more outputs than inputs", 3, 5, 7, 6, 11, 1},
    {"fewer outputs than inputs", 2, 12, 3, 3, 5, 1},
    {"dilation 2 (no gaps in a 1x1 window)", 2, 4, 5, 3, 6, 2},
};

/// Integers in [-range, range] as f32: exact products and sums.
Tensor small_integers(const Shape& shape, uint64_t seed, int range) {
  Tensor t = Tensor::empty(shape, DType::f32);
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = static_cast<float>(static_cast<int>(rng.next_u64() % (2 * range + 1)) - range);
  return t;
}

std::map<std::string, Attr> pointwise_attrs(const PointwiseCase& k, const std::string& format = "NHWC") {
  return {{"strides", std::vector<int64_t>{1, 1}},
          {"paddings", std::vector<int64_t>{0, 0}},
          {"dilations", std::vector<int64_t>{k.dilation, k.dilation}},
          {"groups", int64_t{1}},
          {"data_format", format}};
}

/// What `pass` writes (y forward, x backward data, w backward filter), from
/// cpu::sgemm running conv_gemm's description over x, w and y.
Tensor through_gemm(ConvPass pass, const ConvDims& d, Tensor x, Tensor w, Tensor y) {
  const ConvGemm g = conv_gemm(pass, d, x.raw(), w.raw(), y.raw());
  cpu::sgemm(g.trans_a, g.trans_b, g.m, g.n, g.k, 1.f, static_cast<const float*>(g.a), static_cast<const float*>(g.b),
             0.f, static_cast<float*>(g.c));
  return pass == ConvPass::forward ? y : pass == ConvPass::backward_data ? x : w;
}

void expect_same_floats(const Tensor& got, const Tensor& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  CHECK(got.to_floats() == want.to_floats());
}

}  // namespace

TEST_CASE("a 1x1 channels-last convolution is one GEMM per pass, bit for bit with conv2d", "[conv2d][gemm]") {
  uint64_t seed = 40;
  for (const PointwiseCase& k : kCases) {
    INFO(k.name);
    const Tensor x = small_integers({k.n, k.h, k.w, k.c}, seed++, 3);
    const Tensor filter = small_integers({k.oc, k.c, 1, 1}, seed++, 2);
    const Tensor dy = small_integers({k.n, k.h, k.w, k.oc}, seed++, 3);
    const OpDesc fwd =
        make_op("conv2d", {{"Input", {"x"}}, {"Filter", {"w"}}}, {{"Output", {"y"}}}, pointwise_attrs(k));
    const ConvDims d = conv_dims(fwd, x.shape(), filter.shape());
    REQUIRE(conv_is_one_gemm(d));

    const auto y = run_on({fwd, {{"x", x}, {"w", filter}}}, cpu_device(), {"y"}).at("y");
    const Tensor y_gemm =
        through_gemm(ConvPass::forward, d, x.clone(), filter.clone(), Tensor::empty(y.shape(), DType::f32));
    expect_same_floats(y_gemm, y, "forward");

    const OpDesc bwd = make_op("conv2d_grad", {{"Input", {"x"}}, {"Filter", {"w"}}, {"Output@GRAD", {"dy"}}},
                               {{"Input@GRAD", {"dx"}}, {"Filter@GRAD", {"dw"}}}, pointwise_attrs(k));
    const auto grads = run_on({bwd, {{"x", x}, {"w", filter}, {"dy", dy}}}, cpu_device(), {"dx", "dw"});
    const Tensor dx_gemm =
        through_gemm(ConvPass::backward_data, d, Tensor::empty(x.shape(), DType::f32), filter.clone(), dy.clone());
    expect_same_floats(dx_gemm, grads.at("dx"), "backward data");
    const Tensor dw_gemm =
        through_gemm(ConvPass::backward_filter, d, x.clone(), Tensor::empty(filter.shape(), DType::f32), dy.clone());
    expect_same_floats(dw_gemm, grads.at("dw"), "backward filter");
  }
}

TEST_CASE("only pointwise, unpadded, ungrouped, stride-1 channels-last convolutions are one GEMM", "[conv2d][gemm]") {
  const PointwiseCase k{"", 2, 8, 6, 6, 8, 1};
  auto dims = [&](std::map<std::string, Attr> attrs, Shape filter) {
    const OpDesc op = make_op("conv2d", {{"Input", {"x"}}, {"Filter", {"w"}}}, {{"Output", {"y"}}}, std::move(attrs));
    const bool last = std::get<std::string>(op.attrs.at("data_format")) == "NHWC";
    return conv_dims(op, last ? Shape{k.n, k.h, k.w, k.c} : Shape{k.n, k.c, k.h, k.w}, filter);
  };
  const Shape pointwise{k.oc, k.c, 1, 1};
  CHECK(conv_is_one_gemm(dims(pointwise_attrs(k), pointwise)));
  CHECK_FALSE(conv_is_one_gemm(dims(pointwise_attrs(k, "NCHW"), pointwise)));  // pixels are not rows
  auto with = [&](const std::string& attr, Attr value) {
    auto a = pointwise_attrs(k);
    a[attr] = std::move(value);
    return a;
  };
  CHECK_FALSE(conv_is_one_gemm(dims(with("strides", std::vector<int64_t>{2, 2}), pointwise)));
  CHECK_FALSE(conv_is_one_gemm(dims(with("strides", std::vector<int64_t>{1, 2}), pointwise)));
  CHECK_FALSE(conv_is_one_gemm(dims(with("paddings", std::vector<int64_t>{1, 1}), pointwise)));
  CHECK_FALSE(conv_is_one_gemm(dims(with("paddings", std::vector<int64_t>{0, 1}), pointwise)));
  CHECK_FALSE(conv_is_one_gemm(dims(with("groups", int64_t{2}), {k.oc, k.c / 2, 1, 1})));
  CHECK_FALSE(conv_is_one_gemm(dims(pointwise_attrs(k), {k.oc, k.c, 3, 3})));
  CHECK_FALSE(conv_is_one_gemm(dims(pointwise_attrs(k), {k.oc, k.c, 1, 3})));
  CHECK_FALSE(conv_is_one_gemm(dims(pointwise_attrs(k), {k.oc, k.c, 3, 1})));
}

TEST_CASE("ResNet-50 channels last: 33 of its 53 convolutions are one GEMM per pass", "[conv2d][gemm][resnet]") {
  // Each bottleneck's first and last 1x1 layers (16 blocks), and the first
  // stage's shortcut (1x1, stride 1); the stem, the 3x3 layers and the other
  // shortcuts (stride 2) stay with the convolution libraries. The narrow
  // bottleneck ResNet of test_cuda_train_step's --cublas-1x1-conv case: its
  // two blocks' 1x1 pairs and the first shortcut, 5 of 9.
  struct Case {
    const char* name;
    models::ResNetConfig cfg;
    int64_t convs, gemms;
  };
  models::ResNetConfig narrow = models::resnet_preset("resnet-small");
  narrow.bottleneck = true;
  narrow.width = 4;
  narrow.blocks = {1, 1};
  narrow.image_size = 16;
  for (Case c : {Case{"resnet50", models::resnet_preset("resnet50"), 53, 33}, Case{"narrow bottleneck", narrow, 9, 5}})
    for (bool channels_last : {false, true}) {
      INFO(c.name << (channels_last ? " NHWC" : " NCHW"));
      c.cfg.channels_last = channels_last;
      const models::Model m = models::build_resnet(c.cfg, c.name);
      int64_t convs = 0, gemms = 0;
      for (const OpDesc& op : m.program.ops()) {
        if (op.type != "conv2d") continue;
        ++convs;
        const Shape& input = m.program.var(op.in("Input")).shape;
        gemms += conv_is_one_gemm(conv_dims(op, input, m.program.var(op.in("Filter")).shape));
      }
      CHECK(convs == c.convs);
      CHECK(gemms == (channels_last ? c.gemms : 0));
    }
}
