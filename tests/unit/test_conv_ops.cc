// The convolutional ops of runtime/ops/ (conv2d, batch_norm, pool2d, flatten):
// forward values against direct reference loops written here (double
// accumulation), gradients against central differences and FP16 against FP32
// through the real autodiff and executor (tests/unit/gradcheck.h, where the
// tolerances are argued), and the errors bad shapes and attributes raise.
// Channels last (data_format / data_layout NHWC): the channels-first results,
// permuted, bit for bit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ops/data_format.h"
#include "tests/unit/gradcheck.h"

using namespace mix;
using namespace mix::testing;

namespace {

constexpr Tolerance kF32Forward{1e-5, 1e-5};  // FP32 GEMM against double loops: accumulation order only

struct ConvCfg {
  int64_t n, c, h, w, oc, kh, kw, stride, pad, dil, groups;
  // Along w, where it differs from along h (the attrs are [h, w] pairs); -1: as along h.
  int64_t stride_w = -1, pad_w = -1, dil_w = -1;
  int64_t sw() const { return stride_w < 0 ? stride : stride_w; }
  int64_t pw() const { return pad_w < 0 ? pad : pad_w; }
  int64_t dw() const { return dil_w < 0 ? dil : dil_w; }
};

std::map<std::string, Attr> conv_attrs(const ConvCfg& k) {
  return {{"strides", std::vector<int64_t>{k.stride, k.sw()}},
          {"paddings", std::vector<int64_t>{k.pad, k.pw()}},
          {"dilations", std::vector<int64_t>{k.dil, k.dw()}},
          {"groups", k.groups}};
}

// Direct convolution in double: the definition, loop by loop.
std::vector<double> conv_reference(const ConvCfg& k, const std::vector<float>& x, const std::vector<float>& f) {
  const int64_t oh = (k.h + 2 * k.pad - k.dil * (k.kh - 1) - 1) / k.stride + 1;
  const int64_t ow = (k.w + 2 * k.pw() - k.dw() * (k.kw - 1) - 1) / k.sw() + 1;
  const int64_t cg = k.c / k.groups, ocg = k.oc / k.groups;
  std::vector<double> out(static_cast<size_t>(k.n * k.oc * oh * ow), 0.0);
  for (int64_t n = 0; n < k.n; ++n)
    for (int64_t o = 0; o < k.oc; ++o)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t xx = 0; xx < ow; ++xx) {
          double s = 0;
          const int64_t g = o / ocg;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t i = 0; i < k.kh; ++i)
              for (int64_t j = 0; j < k.kw; ++j) {
                const int64_t iy = y * k.stride - k.pad + i * k.dil, ix = xx * k.sw() - k.pw() + j * k.dw();
                if (iy < 0 || iy >= k.h || ix < 0 || ix >= k.w) continue;
                s += static_cast<double>(x[static_cast<size_t>(((n * k.c + g * cg + ci) * k.h + iy) * k.w + ix)]) *
                     f[static_cast<size_t>(((o * cg + ci) * k.kh + i) * k.kw + j)];
              }
          out[static_cast<size_t>(((n * k.oc + o) * oh + y) * ow + xx)] = s;
        }
  return out;
}

const ConvCfg kConvCases[] = {
    {2, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1},  // ResNet's 3x3 "same" conv
    {2, 4, 6, 6, 4, 3, 3, 2, 1, 1, 1},  // strided (downsampling block)
    {1, 2, 5, 6, 3, 1, 1, 1, 0, 1, 1},  // 1x1 (bottleneck, shortcut)
    {2, 2, 6, 6, 2, 1, 1, 2, 0, 1, 1},  // strided 1x1 (downsample shortcut)
    {1, 2, 7, 7, 2, 3, 3, 1, 2, 2, 1},  // dilated, wide padding
    {2, 4, 5, 5, 6, 3, 3, 1, 1, 1, 2},  // grouped
    {1, 4, 4, 4, 4, 3, 3, 1, 1, 1, 4},  // depthwise
    {1, 3, 9, 9, 2, 7, 7, 2, 3, 1, 1},  // ResNet's 7x7 stem
    {2, 1, 4, 5, 2, 2, 3, 1, 0, 1, 1},  // rectangular filter, rectangular input
    // Strides, paddings and dilations that differ between h and w: each attr's
    // pair must reach its own axis, in im2col and in col2im.
    {2, 3, 7, 8, 4, 3, 2, 2, 1, 1, 1, 1, 0, 2},
    {1, 2, 8, 7, 3, 2, 3, 1, 0, 2, 1, 2, 2, 1},
};

OpCase conv_case(const ConvCfg& k, uint64_t seed) {
  return OpCase{"conv2d",
                {{"Input", uniform_tensor({k.n, k.c, k.h, k.w}, seed)},
                 {"Filter", uniform_tensor({k.oc, k.c / k.groups, k.kh, k.kw}, seed + 1, -0.5f, 0.5f)}},
                {"Output"},
                conv_attrs(k)};
}

// Distinct values k/64 (exact in FP16) in random order, so that no window of a
// max pool holds a tie or a near-tie that a finite-difference step could flip.
Tensor distinct_tensor(const Shape& shape, uint64_t seed) {
  const int64_t n = shape_numel(shape);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i - n / 2) / 64.f;
  Rng rng = Rng::for_stream(seed, 3);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(rng.uniform() * static_cast<double>(i + 1)) % (i + 1)]);
  return Tensor::from_floats(shape, v);
}

}  // namespace

// ---- conv2d -------------------------------------------------------------------------

TEST_CASE("conv2d: forward equals the direct convolution", "[conv2d]") {
  uint64_t seed = 10;
  for (const ConvCfg& k : kConvCases) {
    OpCase c = conv_case(k, seed += 2);
    INFO(c.describe());
    const auto ref = conv_reference(k, c.inputs[0].value.to_floats(), c.inputs[1].value.to_floats());
    expect_close(run_forward(c)["Output"].to_floats(), ref, kF32Forward, "conv2d output");
  }
}

TEST_CASE("conv2d: a hand-computed case", "[conv2d]") {
  // 1x1x3x3 input 1..9, a 2x2 filter of ones, stride 1, no padding: window sums.
  OpCase c{"conv2d",
           {{"Input", Tensor::from_floats({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9})},
            {"Filter", Tensor::from_floats({1, 1, 2, 2}, {1, 1, 1, 1})}},
           {"Output"}};
  expect_close(run_forward(c)["Output"].to_floats(), {12, 16, 24, 28}, {0, 0}, "2x2 window sums");
}

TEST_CASE("conv2d: a batch split into im2col chunks equals the direct convolution", "[conv2d]") {
  // 40 images of a 3x3 conv over 32x32 with 16 channels: the im2col budget
  // (16 MiB) splits the batch into chunks of 28 and 12 images; every image of
  // both chunks must still equal the definition.
  const ConvCfg k{40, 16, 32, 32, 8, 3, 3, 1, 1, 1, 1};
  OpCase c = conv_case(k, 77);
  const auto ref = conv_reference(k, c.inputs[0].value.to_floats(), c.inputs[1].value.to_floats());
  expect_close(run_forward(c)["Output"].to_floats(), ref, kF32Forward, "chunked conv2d output");
}

TEST_CASE("grad: conv2d over a batch split into im2col chunks equals the direct sums", "[grad][conv2d]") {
  // The chunked batch above: conv2d_grad runs the same two chunks (28 and 12
  // images), and Filter@GRAD must sum over both of them, Input@GRAD hold each
  // image's own. With every value a multiple of 1/8 in [-1, 1], each product is
  // a multiple of 2^-6 of magnitude <= 1, so a partial sum of Filter@GRAD's
  // 40 * 32 * 32 < 2^16 terms needs at most 22 bits: exact in FP32 in any
  // order, and the gradients must equal the double sums exactly.
  const ConvCfg k{40, 16, 32, 32, 8, 3, 3, 1, 1, 1, 1};
  auto eighths = [](const Shape& s, uint64_t seed) {
    std::vector<float> v = uniform_tensor(s, seed, -8.f, 9.f).to_floats();
    for (float& x : v) x = std::floor(x) / 8.f;
    return Tensor::from_floats(s, v);
  };
  OpCase c{"conv2d",
           {{"Input", eighths({k.n, k.c, k.h, k.w}, 81)}, {"Filter", eighths({k.oc, k.c, k.kh, k.kw}, 82)}},
           {"Output"},
           conv_attrs(k)};
  const Tensor r = eighths({k.n, k.oc, k.h, k.w}, 83);  // 3x3, padding 1: Output is H x W
  auto b = build_case(c, DType::f32);
  const RunResult res = run_case(*b, c.inputs, {{"Output", r}}, true);
  const std::vector<float> x = c.inputs[0].value.to_floats(), f = c.inputs[1].value.to_floats(), rv = r.to_floats();
  std::vector<double> dx(x.size(), 0.0), dw(f.size(), 0.0);
  for (int64_t n = 0; n < k.n; ++n)
    for (int64_t o = 0; o < k.oc; ++o)
      for (int64_t y = 0; y < k.h; ++y)
        for (int64_t xx = 0; xx < k.w; ++xx) {
          const double g = rv[static_cast<size_t>(((n * k.oc + o) * k.h + y) * k.w + xx)];
          for (int64_t ci = 0; ci < k.c; ++ci)
            for (int64_t i = 0; i < k.kh; ++i)
              for (int64_t j = 0; j < k.kw; ++j) {
                const int64_t iy = y - k.pad + i, ix = xx - k.pad + j;
                if (iy < 0 || iy >= k.h || ix < 0 || ix >= k.w) continue;
                const size_t xi = static_cast<size_t>(((n * k.c + ci) * k.h + iy) * k.w + ix);
                const size_t fi = static_cast<size_t>(((o * k.c + ci) * k.kh + i) * k.kw + j);
                dx[xi] += g * f[fi];
                dw[fi] += g * x[xi];
              }
        }
  expect_close(res.grads[0].to_floats(), dx, {0, 0}, "Input@GRAD of every image");
  expect_close(res.grads[1].to_floats(), dw, {0, 0}, "Filter@GRAD summed over both chunks");
}

TEST_CASE("conv2d: one value of strides, paddings or dilations applies to both dims", "[conv2d]") {
  const ConvCfg k{1, 2, 9, 8, 3, 3, 2, 2, 1, 2, 1};  // stride 2, padding 1, dilation 2
  OpCase c = conv_case(k, 90);
  c.attrs["strides"] = std::vector<int64_t>{2};
  c.attrs["paddings"] = std::vector<int64_t>{1};
  c.attrs["dilations"] = std::vector<int64_t>{2};
  const auto ref = conv_reference(k, c.inputs[0].value.to_floats(), c.inputs[1].value.to_floats());
  expect_close(run_forward(c)["Output"].to_floats(), ref, kF32Forward, "conv2d with [h] attrs");
}

TEST_CASE("grad: conv2d, every configuration", "[grad][conv2d]") {
  uint64_t seed = 300;
  for (const ConvCfg& k : kConvCases) {
    OpCase c = conv_case(k, seed += 2);
    check_gradients_fd(c);
    check_low_precision(c, DType::f16, kF16Tolerance);
  }
  check_low_precision(conv_case(kConvCases[0], 5), DType::bf16, kBf16Tolerance);
}

TEST_CASE("grad: conv2d with only the filter needing a gradient (the first layer)", "[grad][conv2d]") {
  OpCase c = conv_case(kConvCases[1], 44);
  c.inputs[0].differentiable = false;
  check_gradients_fd(c);
}

TEST_CASE("conv2d: bad shapes and attributes name the problem", "[conv2d][errors]") {
  auto fails_with = [](OpCase c, const std::string& text) {
    INFO(c.describe());
    CHECK_THROWS_WITH(run_forward(c), Catch::Contains(text));
  };
  fails_with(OpCase{"conv2d",
                    {{"Input", uniform_tensor({1, 3, 5, 5}, 1)}, {"Filter", uniform_tensor({2, 2, 3, 3}, 2)}},
                    {"Output"}},
             "input channels");
  fails_with(OpCase{"conv2d",
                    {{"Input", uniform_tensor({1, 4, 5, 5}, 1)}, {"Filter", uniform_tensor({3, 2, 3, 3}, 2)}},
                    {"Output"},
                    {{"groups", int64_t{2}}}},
             "groups 2 must divide");
  fails_with(OpCase{"conv2d",
                    {{"Input", uniform_tensor({1, 1, 2, 2}, 1)}, {"Filter", uniform_tensor({1, 1, 3, 3}, 2)}},
                    {"Output"}},
             "does not fit");
  fails_with(OpCase{"conv2d", {{"Input", uniform_tensor({1, 4, 4}, 1)}, {"Filter", uniform_tensor({1, 1, 3, 3}, 2)}},
                    {"Output"}},
             "Input must be [N, C, H, W]");
  fails_with(OpCase{"conv2d",
                    {{"Input", uniform_tensor({1, 1, 4, 4}, 1)}, {"Filter", uniform_tensor({1, 1, 3, 3}, 2)}},
                    {"Output"},
                    {{"strides", std::vector<int64_t>{0, 1}}}},
             "strides and dilations must be positive");
}

// ---- pool2d -------------------------------------------------------------------------

namespace {

struct PoolCfg {
  const char* type;
  int64_t k, stride, pad;
  bool exclusive, global;
  // Along w, where it differs from along h (the attrs are [h, w] pairs); -1: as along h.
  int64_t k_w = -1, stride_w = -1, pad_w = -1;
  int64_t kw() const { return k_w < 0 ? k : k_w; }
  int64_t sw() const { return stride_w < 0 ? stride : stride_w; }
  int64_t pw() const { return pad_w < 0 ? pad : pad_w; }
};

std::map<std::string, Attr> pool_attrs(const PoolCfg& p) {
  return {{"pooling_type", std::string(p.type)},
          {"ksize", std::vector<int64_t>{p.k, p.kw()}},
          {"strides", std::vector<int64_t>{p.stride, p.sw()}},
          {"paddings", std::vector<int64_t>{p.pad, p.pw()}},
          {"exclusive", p.exclusive},
          {"global_pooling", p.global}};
}

std::vector<double> pool_reference(const PoolCfg& p, const Shape& s, const std::vector<float>& x) {
  const int64_t n = s[0], c = s[1], h = s[2], w = s[3];
  const int64_t kh = p.global ? h : p.k, kw = p.global ? w : p.kw(), sh = p.global ? 1 : p.stride,
                sw = p.global ? 1 : p.sw(), ph = p.global ? 0 : p.pad, pw = p.global ? 0 : p.pw();
  const int64_t oh = (h + 2 * ph - kh) / sh + 1, ow = (w + 2 * pw - kw) / sw + 1;
  std::vector<double> out;
  for (int64_t nc = 0; nc < n * c; ++nc)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t xx = 0; xx < ow; ++xx) {
        double best = -INFINITY, sum = 0;
        int64_t count = 0;
        for (int64_t i = 0; i < kh; ++i)
          for (int64_t j = 0; j < kw; ++j) {
            const int64_t iy = y * sh - ph + i, ix = xx * sw - pw + j;
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
            const double v = x[static_cast<size_t>((nc * h + iy) * w + ix)];
            best = std::max(best, v);
            sum += v;
            ++count;
          }
        const bool is_max = std::string(p.type) == "max";
        out.push_back(is_max ? best : sum / static_cast<double>(p.exclusive ? count : kh * kw));
      }
  return out;
}

const PoolCfg kPoolCases[] = {
    {"max", 3, 2, 1, true, false},   // ResNet's stem pool
    {"max", 2, 2, 0, true, false},
    {"avg", 3, 2, 1, true, false},   // exclusive (Paddle's default)
    {"avg", 3, 2, 1, false, false},  // count_include_pad (PyTorch's default)
    {"avg", 2, 1, 0, true, false},   // overlapping windows
    {"avg", 0, 1, 0, true, true},    // global average (ResNet's head)
    {"max", 0, 1, 0, true, true},    // global max
    // Windows, strides and paddings that differ between h and w.
    {"avg", 3, 2, 1, false, false, 2, 1, 0},  // count_include_pad divides by kh kw
    {"max", 2, 1, 0, true, false, 3, 2, 1},
};

}  // namespace

TEST_CASE("pool2d: forward equals the direct loops", "[pool2d]") {
  const Shape s{2, 3, 7, 6};
  uint64_t seed = 20;
  for (const PoolCfg& p : kPoolCases) {
    OpCase c{"pool2d", {{"X", distinct_tensor(s, ++seed)}}, {"Out"}, pool_attrs(p)};
    INFO(c.describe());
    expect_close(run_forward(c)["Out"].to_floats(), pool_reference(p, s, c.inputs[0].value.to_floats()), kF32Forward,
                 "pool2d output");
  }
}

TEST_CASE("pool2d: exclusive and inclusive average differ only at the border", "[pool2d]") {
  // All ones: exclusive gives 1 everywhere; counting the padding gives 4/9 in a corner.
  OpCase c{"pool2d", {{"X", Tensor::from_floats({1, 1, 4, 4}, std::vector<float>(16, 1.f))}}, {"Out"},
           pool_attrs({"avg", 3, 2, 1, true, false})};
  expect_close(run_forward(c)["Out"].to_floats(), {1, 1, 1, 1}, {1e-7, 0}, "exclusive");
  c.attrs["exclusive"] = false;
  expect_close(run_forward(c)["Out"].to_floats(), {4. / 9, 6. / 9, 6. / 9, 1}, {1e-7, 0}, "count_include_pad");
}

TEST_CASE("pool2d: max-pool gradient goes to the first maximum", "[pool2d][grad]") {
  // Two equal maxima in one 2x2 window: PyTorch routes the gradient to the first (row-major).
  OpCase c{"pool2d", {{"X", Tensor::from_floats({1, 1, 2, 2}, {3, 5, 5, 1})}}, {"Out"},
           pool_attrs({"max", 2, 2, 0, true, false})};
  auto b = build_case(c, DType::f32);
  std::map<std::string, Tensor> r = {{"Out", Tensor::from_floats({1, 1, 1, 1}, {2.f})}};
  const RunResult res = run_case(*b, c.inputs, r, true);
  expect_close(res.grads[0].to_floats(), {0, 2, 0, 0}, {0, 0}, "max-pool gradient");
}

TEST_CASE("grad: pool2d, every configuration", "[grad][pool2d]") {
  uint64_t seed = 400;
  for (const PoolCfg& p : kPoolCases) {
    OpCase c{"pool2d", {{"X", distinct_tensor({2, 2, 5, 6}, ++seed)}}, {"Out"}, pool_attrs(p)};
    check_gradients_fd(c);
    check_low_precision(c, DType::f16, kF16Tolerance);
  }
}

TEST_CASE("pool2d: bad attributes name the problem", "[pool2d][errors]") {
  auto fails_with = [](const std::map<std::string, Attr>& attrs, const std::string& text) {
    OpCase c{"pool2d", {{"X", uniform_tensor({1, 1, 4, 4}, 1)}}, {"Out"}, attrs};
    CHECK_THROWS_WITH(run_forward(c), Catch::Contains(text));
  };
  fails_with({{"pooling_type", std::string("median")}, {"ksize", std::vector<int64_t>{2, 2}}}, "pooling_type");
  fails_with({{"ksize", std::vector<int64_t>{2, 2}}, {"paddings", std::vector<int64_t>{2, 2}}},
             "must be smaller than ksize");
  fails_with({{"pooling_type", std::string("max")}}, "ksize and strides must be positive");
  fails_with({{"ksize", std::vector<int64_t>{2, 2}}, {"ceil_mode", true}}, "ceil_mode");
}

// ---- batch_norm -------------------------------------------------------------------------

namespace {

OpCase bn_case(const Shape& x, uint64_t seed) {
  const int64_t c = x[1];
  OpCase bn{"batch_norm",
            {{"X", uniform_tensor(x, seed, -2.f, 3.f)},
             {"Scale", uniform_tensor({c}, seed + 1, 0.5f, 1.5f), true, true},
             {"Bias", uniform_tensor({c}, seed + 2), true, true},
             {"Mean", uniform_tensor({c}, seed + 3), false, true},
             {"Variance", uniform_tensor({c}, seed + 4, 0.5f, 2.f), false, true}},
            {"Y", "MeanOut", "VarianceOut", "SavedMean", "SavedVariance"},
            {{"momentum", 0.9}, {"epsilon", 1e-5}},
            {"Y"},
            {"MeanOut", "VarianceOut", "SavedMean", "SavedVariance"}};
  return bn;
}

}  // namespace

TEST_CASE("batch_norm: training normalises per channel and updates the running statistics", "[batch_norm]") {
  const Shape s{3, 2, 4, 5};
  OpCase c = bn_case(s, 50);
  const std::vector<float> x = c.inputs[0].value.to_floats(), scale = c.inputs[1].value.to_floats(),
                           bias = c.inputs[2].value.to_floats(), rmean = c.inputs[3].value.to_floats(),
                           rvar = c.inputs[4].value.to_floats();
  auto out = run_forward(c);
  const std::vector<float> y = out["Y"].to_floats();
  const int64_t spatial = 20, m = 3 * spatial;
  std::vector<double> y_ref(y.size()), mean_out, var_out, saved_mean, saved_inv;
  for (int64_t ch = 0; ch < 2; ++ch) {
    double mean = 0, var = 0;
    for (int64_t n = 0; n < 3; ++n)
      for (int64_t i = 0; i < spatial; ++i) mean += x[static_cast<size_t>((n * 2 + ch) * spatial + i)];
    mean /= static_cast<double>(m);
    for (int64_t n = 0; n < 3; ++n)
      for (int64_t i = 0; i < spatial; ++i) var += std::pow(x[static_cast<size_t>((n * 2 + ch) * spatial + i)] - mean, 2);
    var /= static_cast<double>(m);
    const double inv = 1 / std::sqrt(var + 1e-5);
    for (int64_t n = 0; n < 3; ++n)
      for (int64_t i = 0; i < spatial; ++i) {
        const size_t k = static_cast<size_t>((n * 2 + ch) * spatial + i);
        y_ref[k] = (x[k] - mean) * inv * scale[static_cast<size_t>(ch)] + bias[static_cast<size_t>(ch)];
      }
    saved_mean.push_back(mean);
    saved_inv.push_back(inv);
    // PyTorch's update with momentum 0.1 (Paddle's 0.9): the running variance takes the unbiased variance.
    mean_out.push_back(0.9 * rmean[static_cast<size_t>(ch)] + 0.1 * mean);
    var_out.push_back(0.9 * rvar[static_cast<size_t>(ch)] + 0.1 * var * m / (m - 1));
  }
  expect_close(y, y_ref, {1e-5, 1e-5}, "Y");
  expect_close(out["SavedMean"].to_floats(), saved_mean, {1e-6, 1e-6}, "SavedMean");
  expect_close(out["SavedVariance"].to_floats(), saved_inv, {1e-6, 1e-5}, "SavedVariance (1/std)");
  expect_close(out["MeanOut"].to_floats(), mean_out, {1e-6, 1e-6}, "running mean");
  expect_close(out["VarianceOut"].to_floats(), var_out, {1e-6, 1e-6}, "running variance");
}

TEST_CASE("batch_norm: evaluation normalises with the running statistics", "[batch_norm]") {
  OpCase c = bn_case({2, 3, 2, 2}, 60);
  const std::vector<float> x = c.inputs[0].value.to_floats(), scale = c.inputs[1].value.to_floats(),
                           bias = c.inputs[2].value.to_floats(), rmean = c.inputs[3].value.to_floats(),
                           rvar = c.inputs[4].value.to_floats();
  std::vector<double> ref(x.size());
  for (size_t k = 0; k < x.size(); ++k) {
    const size_t ch = (k / 4) % 3;
    ref[k] = (x[k] - rmean[ch]) / std::sqrt(rvar[ch] + 1e-5) * scale[ch] + bias[ch];
  }
  auto eval = run_forward(c, DType::f32, false);
  expect_close(eval["Y"].to_floats(), ref, {1e-5, 1e-5}, "eval via ExecEnv::training");
  CHECK(eval.count("MeanOut") == 0);  // evaluation updates no statistics
  // An always-evaluating batch_norm (is_test) needs no statistics outputs.
  c.attrs["is_test"] = true;
  c.outputs = {"Y"};
  c.fp32_outputs = {};
  expect_close(run_forward(c)["Y"].to_floats(), ref, {1e-5, 1e-5}, "eval via is_test");
}

TEST_CASE("batch_norm: FP16 activations keep FP32 statistics and parameters", "[batch_norm]") {
  OpCase c = bn_case({2, 3, 2, 2}, 70);
  auto out = run_forward(c, DType::f16);
  CHECK(out["Y"].dtype() == DType::f16);
  for (const char* slot : {"MeanOut", "VarianceOut", "SavedMean", "SavedVariance"}) {
    INFO(slot);
    CHECK(out[slot].dtype() == DType::f32);
  }
}

TEST_CASE("grad: batch_norm in training mode, 4-D and 2-D", "[grad][batch_norm]") {
  for (const Shape& s : {Shape{2, 3, 3, 2}, Shape{6, 4}, Shape{1, 2, 5, 5}}) {
    OpCase c = bn_case(s, 80 + static_cast<uint64_t>(s.size()));
    check_gradients_fd(c);
    check_low_precision(c, DType::f16, kF16Tolerance);
  }
}

TEST_CASE("batch_norm: errors name the problem", "[batch_norm][errors]") {
  OpCase one = bn_case({1, 2, 1, 1}, 90);
  CHECK_THROWS_WITH(run_forward(one), Catch::Contains("more than one value per channel"));
  OpCase wrong = bn_case({2, 3, 2, 2}, 91);
  wrong.inputs[1].value = uniform_tensor({4}, 1);
  CHECK_THROWS_WITH(run_forward(wrong), Catch::Contains("Scale"));
  OpCase no_saved = bn_case({2, 3, 2, 2}, 92);
  no_saved.outputs = {"Y", "MeanOut", "VarianceOut", "SavedVariance"};
  CHECK_THROWS_WITH(run_forward(no_saved), Catch::Contains("SavedMean is required in training"));
}

// ---- channels last (NHWC) ---------------------------------------------------------------

namespace {

using layout::channels_last_copy;

// `nchw` with `layout_attr` NHWC and its image tensors (the slots in `image`,
// inputs and outputs) channels last must give the channels-first outputs and
// gradients exactly: image ones permuted, the others (filters, statistics,
// parameter gradients) unchanged. The loss's R is permuted with its output,
// so both runs differentiate the same function.
void check_channels_last(const OpCase& nchw, const char* layout_attr, const std::set<std::string>& image, DType dtype) {
  INFO(nchw.describe() << " in " << dtype_name(dtype));
  OpCase nhwc = nchw;
  nhwc.attrs[layout_attr] = std::string("NHWC");
  for (auto& in : nhwc.inputs)
    if (image.count(in.slot)) in.value = channels_last_copy(in.value);
  auto first_case = build_case(nchw, dtype);
  auto last_case = build_case(nhwc, dtype);
  const auto r = make_projections(*first_case, nchw, dtype, 11);
  std::map<std::string, Tensor> r_last;
  for (auto& [slot, t] : r) r_last[slot] = image.count(slot) ? channels_last_copy(t) : t;
  const RunResult first = run_case(*first_case, nchw.inputs, r, true);
  const RunResult last = run_case(*last_case, nhwc.inputs, r_last, true);
  auto expect_same = [&](const Tensor& got, const Tensor& channels_first, bool is_image, const std::string& what) {
    INFO(what);
    REQUIRE(got.defined() == channels_first.defined());
    if (!got.defined()) return;
    const Tensor want = is_image ? channels_last_copy(channels_first) : channels_first;
    CHECK(got.shape() == want.shape());
    CHECK(got.dtype() == want.dtype());
    CHECK(got.to_floats() == want.to_floats());
  };
  for (auto& key : nchw.output_keys())
    expect_same(last.outputs.at(key), first.outputs.at(key), image.count(key) > 0, "output " + key);
  for (size_t i = 0; i < nchw.inputs.size(); ++i)
    expect_same(last.grads[i], first.grads[i], image.count(nchw.inputs[i].slot) > 0,
                "gradient of " + nchw.inputs[i].slot);
}

}  // namespace

TEST_CASE("conv2d: channels last gives the channels-first output and gradients", "[conv2d][nhwc]") {
  uint64_t seed = 500;
  for (const ConvCfg& k : kConvCases)
    for (DType t : {DType::f32, DType::f16})
      check_channels_last(conv_case(k, seed += 2), "data_format", {"Input", "Output"}, t);
  // The output shape is [N, OH, OW, OC]: a 5x6 input, a 3x3 filter, no padding, 4 filters.
  OpCase c = conv_case({1, 2, 5, 6, 4, 3, 3, 1, 0, 1, 1}, 7);
  c.attrs["data_format"] = std::string("NHWC");
  c.inputs[0].value = uniform_tensor({1, 5, 6, 2}, 8);
  CHECK(run_forward(c)["Output"].shape() == Shape{1, 3, 4, 4});
}

TEST_CASE("pool2d: channels last gives the channels-first output and gradient", "[pool2d][nhwc]") {
  uint64_t seed = 600;
  for (const PoolCfg& p : kPoolCases)
    for (DType t : {DType::f32, DType::f16}) {
      OpCase c{"pool2d", {{"X", distinct_tensor({2, 3, 7, 6}, ++seed)}}, {"Out"}, pool_attrs(p)};
      check_channels_last(c, "data_format", {"X", "Out"}, t);
    }
}

TEST_CASE("batch_norm: channels last gives the channels-first results, training and evaluation", "[batch_norm][nhwc]") {
  for (const Shape& s : {Shape{2, 3, 3, 2}, Shape{3, 4, 5}, Shape{6, 4}})
    for (DType t : {DType::f32, DType::f16}) {
      OpCase c = bn_case(s, 700 + static_cast<uint64_t>(s.size()));
      check_channels_last(c, "data_layout", {"X", "Y"}, t);
      // Evaluation reads the running statistics per channel, which channels last must still find.
      OpCase last = c;
      last.attrs["data_layout"] = std::string("NHWC");
      last.inputs[0].value = channels_last_copy(c.inputs[0].value);
      const Tensor first_y = run_forward(c, t, false).at("Y");
      CHECK(run_forward(last, t, false).at("Y").to_floats() == channels_last_copy(first_y).to_floats());
    }
}

TEST_CASE("data_format: a layout other than NCHW or NHWC, or channels that do not fit, name the problem",
          "[conv2d][pool2d][batch_norm][nhwc][errors]") {
  OpCase conv = conv_case(kConvCases[0], 3);
  conv.attrs["data_format"] = std::string("NWHC");
  CHECK_THROWS_WITH(run_forward(conv), Catch::Contains("data_format must be NCHW or NHWC, got 'NWHC'"));
  conv.attrs["data_format"] = std::string("NHWC");  // the Input is still [N, C, H, W]: 5 channels by the last dim
  CHECK_THROWS_WITH(run_forward(conv), Catch::Contains("input channels"));
  OpCase pool{"pool2d", {{"X", uniform_tensor({1, 2, 3}, 4)}}, {"Out"}, pool_attrs(kPoolCases[0])};
  pool.attrs["data_format"] = std::string("NHWC");
  CHECK_THROWS_WITH(run_forward(pool), Catch::Contains("[N, H, W, C]"));
  OpCase bn = bn_case({2, 3, 2, 2}, 5);
  bn.attrs["data_layout"] = std::string("NHWC");  // X's last dim is 2, Scale has 3 channels
  CHECK_THROWS_WITH(run_forward(bn), Catch::Contains("Scale"));
}

// ---- flatten ------------------------------------------------------------------------------

TEST_CASE("flatten: a view as [outer, inner], and its gradient", "[flatten]") {
  OpCase c{"flatten", {{"X", uniform_tensor({2, 3, 1, 2}, 5)}}, {"Out"}};
  auto out = run_forward(c);
  CHECK(out["Out"].shape() == Shape{2, 6});
  CHECK(out["Out"].to_floats() == c.inputs[0].value.to_floats());
  c.attrs["axis"] = int64_t{2};
  CHECK(run_forward(c)["Out"].shape() == Shape{6, 2});
  c.attrs["axis"] = int64_t{1};
  check_gradients_fd(c);
}
