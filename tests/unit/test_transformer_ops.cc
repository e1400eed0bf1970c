// The ops a GPT-style Transformer adds to runtime/ops/: lookup_table, layer_norm,
// transpose2, split, dropout and softmax's causal mask. Forward values against
// straightforward double-precision loops written here, gradients against
// central differences and FP16/BF16 against FP32 through the real autodiff and
// executor (tests/unit/gradcheck.h, where the tolerances are argued), shape
// inference with -1 batch dims, dropout's mask statistics and reproducibility,
// and the errors bad inputs raise.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/kernels/dropout_mask.h"
#include "runtime/kernels/transpose_index.h"
#include "runtime/ops/transpose2_shapes.h"
#include "tests/unit/gradcheck.h"

using namespace mix;
using namespace mix::testing;
using Catch::Matchers::Contains;

namespace {

// f32 kernels against double references over short rows: a few ulps (~1e-7 rel).
constexpr Tolerance kF32{1e-5, 1e-5};
// An f16 output against the double result on the same (f16-exact) inputs: one
// rounding on store, u = 2^-11 relative, plus FP32 arithmetic before it.
constexpr Tolerance kF16Out{1e-3, 1e-3};

void check_all(const OpCase& c, bool bf16 = true) {
  check_gradients_fd(c);
  check_low_precision(c, DType::f16, kF16Tolerance);
  if (bf16) check_low_precision(c, DType::bf16, kBf16Tolerance);
}

std::vector<double> doubles(const std::vector<float>& v) { return {v.begin(), v.end()}; }

Tensor i32_tensor(const Shape& shape, const std::vector<int32_t>& values) {
  REQUIRE(shape_numel(shape) == static_cast<int64_t>(values.size()));
  Tensor t = Tensor::empty(shape, DType::i32);
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

// The row-major multi-index of flat element i of shape s.
std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t k = s.size(); k-- > 0;) {
    idx[k] = i % s[k];
    i /= s[k];
  }
  return idx;
}
int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t i = 0;
  for (size_t k = 0; k < s.size(); ++k) i = i * s[k] + idx[k];
  return i;
}

}  // namespace

// ---- lookup_table -------------------------------------------------------------------------

TEST_CASE("lookup_table: rows of W by id, zeros for padding_idx, i64 and i32 ids", "[ops][transformer][lookup_table]") {
  const Tensor w = uniform_tensor({6, 4}, 1);
  const std::vector<int64_t> ids = {3, 0, 5, 3, 2, 1};  // [2, 3], a duplicate
  const std::vector<float> wv = w.to_floats();
  // padding_idx 0 (the usual choice, a padding token of id 0) is a row like any other.
  for (int64_t padding : {int64_t{-1}, int64_t{0}, int64_t{3}}) {
    for (bool i32 : {false, true}) {
      const Tensor idt = i32 ? i32_tensor({2, 3}, {3, 0, 5, 3, 2, 1}) : i64_tensor({2, 3}, ids);
      OpCase c{"lookup_table", {{"W", w}, {"Ids", idt}}, {"Out"}, {{"padding_idx", padding}}};
      INFO(c.describe() << (i32 ? " (i32 ids)" : ""));
      const Tensor out = run_forward(c)["Out"];
      REQUIRE(out.shape() == Shape{2, 3, 4});
      std::vector<double> ref;
      for (int64_t id : ids)
        for (int64_t j = 0; j < 4; ++j) ref.push_back(id == padding ? 0.0 : wv[static_cast<size_t>(id * 4 + j)]);
      expect_close(out.to_floats(), ref, {0, 0}, "lookup_table rows (a copy: exact)");
    }
  }
  // FP16 W: the rows are copied bit for bit, and Out keeps W's dtype.
  OpCase c{"lookup_table", {{"W", w}, {"Ids", i64_tensor({3}, {5, 5, 0})}}, {"Out"}};
  const Tensor out16 = run_forward(c, DType::f16)["Out"];
  CHECK(out16.dtype() == DType::f16);
  const std::vector<float> w16 = rounded_through(w, DType::f16).to_floats();
  std::vector<double> ref;
  for (int64_t id : {5, 5, 0})
    for (int64_t j = 0; j < 4; ++j) ref.push_back(w16[static_cast<size_t>(id * 4 + j)]);
  expect_close(out16.to_floats(), ref, {0, 0}, "lookup_table f16 rows");
}

TEST_CASE("grad: lookup_table, duplicate ids sum, padding row gets none", "[grad][transformer][lookup_table]") {
  // Id 2 appears three times (its gradient is the sum of three rows of R), id 4
  // never (zero gradient), id 1 is the padding row (zero gradient though used).
  const Tensor ids = i64_tensor({2, 4}, {2, 0, 2, 1, 3, 2, 1, 5});
  OpCase c{"lookup_table", {{"W", uniform_tensor({6, 3}, 2)}, {"Ids", ids}}, {"Out"}, {{"padding_idx", int64_t{1}}}};
  check_all(c);
  OpCase no_pad{"lookup_table", {{"W", uniform_tensor({5, 2}, 3)}, {"Ids", i64_tensor({5}, {4, 4, 0, 4, 1})}}, {"Out"}};
  check_all(no_pad);
  // The analytic gradient, row by row, against a double scatter-add of R.
  auto b = build_case(c, DType::f32);
  const auto r = make_projections(*b, c, DType::f16, 9);
  const RunResult res = run_case(*b, c.inputs, r, true);
  const std::vector<float> rv = r.at("Out").to_floats();
  std::vector<double> ref(18, 0.0);
  const std::vector<int64_t> idv = {2, 0, 2, 1, 3, 2, 1, 5};
  for (size_t i = 0; i < idv.size(); ++i)
    if (idv[i] != 1)
      for (size_t j = 0; j < 3; ++j) ref[static_cast<size_t>(idv[i]) * 3 + j] += rv[i * 3 + j];
  expect_close(res.grads[0].to_floats(), ref, {1e-6, 1e-6}, "W@GRAD scatter-add");
}

TEST_CASE("lookup_table: out-of-range ids and bad tables name the problem",
          "[ops][transformer][lookup_table][errors]") {
  const Tensor w = uniform_tensor({5, 2}, 1);
  OpCase hi{"lookup_table", {{"W", w}, {"Ids", i64_tensor({2, 2}, {0, 1, 7, 2})}}, {"Out"}};
  CHECK_THROWS_AS(run_forward(hi), Error);
  CHECK_THROWS_WITH(run_forward(hi), Contains("id 7") && Contains("position [1, 0]") && Contains("5 rows"));
  OpCase neg{"lookup_table", {{"W", w}, {"Ids", i64_tensor({3}, {0, -1, 2})}}, {"Out"}};
  CHECK_THROWS_WITH(run_forward(neg), Contains("id -1") && Contains("position [1]"));
  OpCase pad{"lookup_table", {{"W", w}, {"Ids", i64_tensor({1}, {0})}}, {"Out"}, {{"padding_idx", int64_t{5}}}};
  CHECK_THROWS_WITH(run_forward(pad), Contains("padding_idx 5"));
  OpCase fids{"lookup_table", {{"W", w}, {"Ids", uniform_tensor({2}, 3), false}}, {"Out"}};
  CHECK_THROWS_WITH(run_forward(fids), Contains("Ids") && Contains("i64 or i32"));
}

// ---- layer_norm ---------------------------------------------------------------------------

namespace {

struct LnRef {
  std::vector<double> y, mean, var;
};

// The definition in double: per row of `cols` values, biased variance.
LnRef ln_reference(const std::vector<float>& x, int64_t cols, const std::vector<float>* scale,
                   const std::vector<float>* bias, double eps) {
  LnRef r;
  const int64_t rows = static_cast<int64_t>(x.size()) / cols;
  for (int64_t i = 0; i < rows; ++i) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < cols; ++j) m += x[i * cols + j];
    m /= static_cast<double>(cols);
    for (int64_t j = 0; j < cols; ++j) v += (x[i * cols + j] - m) * (x[i * cols + j] - m);
    v /= static_cast<double>(cols);
    r.mean.push_back(m);
    r.var.push_back(v);
    for (int64_t j = 0; j < cols; ++j) {
      const double s = scale ? (*scale)[j] : 1.0, b = bias ? (*bias)[j] : 0.0;
      r.y.push_back((x[i * cols + j] - m) / std::sqrt(v + eps) * s + b);
    }
  }
  return r;
}

OpCase ln_case(const Shape& x, int64_t begin, int64_t cols, uint64_t seed, bool with_scale = true,
               bool with_bias = true) {
  OpCase c{"layer_norm",
           {{"X", uniform_tensor(x, seed, -2.f, 3.f)}},
           {"Y", "Mean", "Variance"},
           {{"begin_norm_axis", begin}, {"epsilon", 1e-5}},
           {"Y"},
           {"Mean", "Variance"}};
  if (with_scale) c.inputs.push_back({"Scale", uniform_tensor({cols}, seed + 1, 0.5f, 1.5f), true, true});
  if (with_bias) c.inputs.push_back({"Bias", uniform_tensor({cols}, seed + 2), true, true});
  return c;
}

struct LnCfg {
  Shape x;
  int64_t begin, cols;
};
const LnCfg kLnCases[] = {
    {{2, 3, 8}, -1, 8},   // the Transformer's [B, T, D] over D
    {{2, 3, 8}, 2, 8},    // the same axis, counted from the front
    {{2, 3, 4}, 1, 12},   // over [T, D] (Paddle's default axis 1)
    {{3, 2, 5}, -2, 10},  // negative, two dims
    {{4, 6}, 1, 6},       // 2-D
};

}  // namespace

TEST_CASE("layer_norm: Y, Mean and Variance against the definition", "[ops][transformer][layer_norm]") {
  uint64_t seed = 10;
  for (const LnCfg& k : kLnCases) {
    for (int params = 0; params < 3; ++params) {  // scale and bias, neither, scale only
      OpCase c = ln_case(k.x, k.begin, k.cols, seed += 3, params != 1, params == 0);
      INFO(c.describe());
      const std::vector<float> x = c.inputs[0].value.to_floats();
      std::vector<float> scale, bias;
      if (params != 1) scale = c.inputs[1].value.to_floats();
      if (params == 0) bias = c.inputs[2].value.to_floats();
      const LnRef ref = ln_reference(x, k.cols, params != 1 ? &scale : nullptr, params == 0 ? &bias : nullptr, 1e-5);
      auto out = run_forward(c);
      REQUIRE(out["Mean"].shape() == Shape{static_cast<int64_t>(x.size()) / k.cols});
      expect_close(out["Y"].to_floats(), ref.y, kF32, "Y");
      expect_close(out["Mean"].to_floats(), ref.mean, kF32, "Mean");
      expect_close(out["Variance"].to_floats(), ref.var, kF32, "Variance (biased)");
    }
  }
}

TEST_CASE("layer_norm: FP16 and BF16 X keep FP32 statistics and parameters", "[ops][transformer][layer_norm]") {
  // A large mean (100) over a small spread: sum(x^2)/n - mean^2 would cancel in
  // float; the two-pass double statistics do not.
  const Tensor x = uniform_tensor({4, 16}, 7, 99.f, 101.f);
  OpCase c{"layer_norm",
           {{"X", x}, {"Scale", uniform_tensor({16}, 8, 0.5f, 1.5f), true, true}},
           {"Y", "Mean", "Variance"},
           {{"begin_norm_axis", int64_t{1}}}};
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    INFO(dtype_name(dt));
    const std::vector<float> xr = rounded_through(x, dt).to_floats();
    const std::vector<float> scale = c.inputs[1].value.to_floats();
    const LnRef ref = ln_reference(xr, 16, &scale, nullptr, 1e-5);
    auto out = run_forward(c, dt);
    CHECK(out["Y"].dtype() == dt);
    CHECK(out["Mean"].dtype() == DType::f32);
    CHECK(out["Variance"].dtype() == DType::f32);
    expect_close(out["Mean"].to_floats(), ref.mean, {1e-6, 1e-7}, "Mean in FP32");
    expect_close(out["Variance"].to_floats(), ref.var, {1e-6, 1e-5}, "Variance in FP32");
    // f32: the FP32 Mean near 100 is off by up to half an ulp (3.8e-6), ~1e-5 in
    // Y after inv_std (1.7) and scale (<= 1.5). f16 / bf16: Y rounded once (2^-11, 2^-8).
    const double u = dt == DType::f32 ? 3e-5 : dt == DType::f16 ? kF16Out.rel : 8e-3;
    expect_close(out["Y"].to_floats(), ref.y, {u, u}, "Y rounded once");
  }
}

TEST_CASE("grad: layer_norm, X, Scale and Bias, several begin_norm_axis", "[grad][transformer][layer_norm]") {
  uint64_t seed = 40;
  for (const LnCfg& k : kLnCases) check_all(ln_case(k.x, k.begin, k.cols, seed += 3));
  // No Scale and no Bias; only Scale wanted; only X wanted (frozen parameters).
  check_all(ln_case({3, 5}, 1, 5, 70, false, false));
  OpCase scale_only = ln_case({2, 3, 4}, -1, 4, 71);
  scale_only.inputs[0].differentiable = false;
  scale_only.inputs[2].differentiable = false;
  check_gradients_fd(scale_only);
  OpCase x_only = ln_case({2, 3, 4}, -1, 4, 72);
  x_only.inputs[1].differentiable = false;
  x_only.inputs[2].differentiable = false;
  check_gradients_fd(x_only);
}

TEST_CASE("layer_norm: bad axis and parameter shapes name the problem", "[ops][transformer][layer_norm][errors]") {
  OpCase axis = ln_case({2, 3}, 2, 3, 1);
  CHECK_THROWS_WITH(run_forward(axis), Contains("begin_norm_axis 2 is out of range"));
  OpCase neg = ln_case({2, 3}, -3, 3, 1);
  CHECK_THROWS_WITH(run_forward(neg), Contains("begin_norm_axis -3 is out of range"));
  OpCase scale = ln_case({2, 3, 4}, -1, 12, 1);  // Scale [12] where a row has 4 values
  CHECK_THROWS_WITH(run_forward(scale), Contains("Scale") && Contains("f32[4]"));
}

TEST_CASE("layer_norm, lookup_table, transpose2, split, dropout: inference keeps -1 batch dims",
          "[ops][transformer][infer]") {
  Program p;
  p.add_var(var_desc("x", {-1, 5, 6}, DType::f16));
  p.add_var(var_desc("ids", {-1, 5}, DType::i64));
  p.add_var(var_desc("w", {10, 6}, DType::f32));
  p.add_var(var_desc("s", {6}, DType::f32));
  p.append_op(make_op("layer_norm", {{"X", {"x"}}, {"Scale", {"s"}}},
                      {{"Y", {"y"}}, {"Mean", {"m"}}, {"Variance", {"v"}}}, {{"begin_norm_axis", int64_t{-1}}}));
  CHECK(p.var("y").shape == Shape{-1, 5, 6});
  CHECK(p.var("y").dtype == DType::f16);
  CHECK(p.var("m").shape == Shape{-1});
  CHECK(p.var("m").dtype == DType::f32);
  p.append_op(make_op("lookup_table", {{"W", {"w"}}, {"Ids", {"ids"}}}, {{"Out", {"e"}}}));
  CHECK(p.var("e").shape == Shape{-1, 5, 6});
  CHECK(p.var("e").dtype == DType::f32);
  p.append_op(make_op("transpose2", {{"X", {"x"}}}, {{"Out", {"t"}}, {"XShape", {"ts"}}},
                      {{"axis", std::vector<int64_t>{1, 0, 2}}}));
  CHECK(p.var("t").shape == Shape{5, -1, 6});
  CHECK(p.var("ts").shape == Shape{0, -1, 5, 6});
  p.append_op(
      make_op("split", {{"X", {"x"}}}, {{"Out", {"a", "b", "c"}}}, {{"axis", int64_t{-1}}, {"num", int64_t{3}}}));
  CHECK(p.var("c").shape == Shape{-1, 5, 2});
  p.append_op(make_op("split", {{"X", {"x"}}}, {{"Out", {"d", "e2"}}},
                      {{"axis", int64_t{0}}, {"sections", std::vector<int64_t>{2, -1}}}));
  CHECK(p.var("d").shape == Shape{2, 5, 6});
  CHECK(p.var("e2").shape == Shape{-1, 5, 6});  // the rest of an unknown batch
  p.append_op(make_op("dropout", {{"X", {"x"}}}, {{"Out", {"o"}}, {"Mask", {"mask"}}}, {{"dropout_prob", 0.1}}));
  CHECK(p.var("o").shape == Shape{-1, 5, 6});
  CHECK(p.var("mask").dtype == DType::u8);
  CHECK(p.var("mask").shape == Shape{-1, 5, 6});
}

// ---- transpose2 ---------------------------------------------------------------------------

namespace {

template <typename E>
std::vector<E> ref_transpose(const std::vector<E>& x, const Shape& xs, const std::vector<int64_t>& perm) {
  Shape os(perm.size());
  for (size_t k = 0; k < perm.size(); ++k) os[k] = xs[static_cast<size_t>(perm[k])];
  std::vector<E> out(x.size());
  for (int64_t o = 0; o < static_cast<int64_t>(x.size()); ++o) {
    const std::vector<int64_t> oi = unravel(o, os);
    std::vector<int64_t> xi(xs.size());
    for (size_t k = 0; k < perm.size(); ++k) xi[static_cast<size_t>(perm[k])] = oi[k];
    out[static_cast<size_t>(o)] = x[static_cast<size_t>(ravel(xi, xs))];
  }
  return out;
}

struct TrCfg {
  Shape x;
  std::vector<int64_t> perm;
};
const TrCfg kTrCases[] = {
    {{2, 3, 4, 5}, {0, 2, 1, 3}},        // [B, T, H, hd] -> [B, H, T, hd]
    {{2, 4, 3, 5}, {0, 2, 1, 3}},        // and back
    {{2, 3, 4}, {0, 2, 1}},              // K^T: the last axis moves (strided copy)
    {{3, 4}, {1, 0}},                    // 2-D
    {{2, 3, 1, 2, 3}, {4, 2, 0, 3, 1}},  // 5-D with a size-1 dim
    {{2, 1, 3, 2, 2}, {0, 3, 4, 1, 2}},  // 5-D, merged pairs
    {{2, 3, 4}, {0, 1, 2}},              // identity: one run
    {{1, 3, 1, 4}, {2, 3, 0, 1}},        // size-1 dims everywhere
};

}  // namespace

TEST_CASE("transpose2: permuted copies against index arithmetic, any dtype", "[ops][transformer][transpose2]") {
  uint64_t seed = 80;
  for (const TrCfg& k : kTrCases) {
    OpCase c{"transpose2", {{"X", uniform_tensor(k.x, ++seed)}}, {"Out", "XShape"}, {{"axis", k.perm}}};
    INFO(c.describe());
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
      auto out = run_forward(c, dt);
      CHECK(out["Out"].dtype() == dt);
      CHECK(out["XShape"].numel() == 0);
      expect_close(out["Out"].to_floats(),
                   doubles(ref_transpose(rounded_through(c.inputs[0].value, dt).to_floats(), k.x, k.perm)), {0, 0},
                   "transpose2 " + std::string(dtype_name(dt)));
    }
    // i64 (8-byte elements), values that would not survive a float round trip.
    std::vector<int64_t> iv(static_cast<size_t>(shape_numel(k.x)));
    for (size_t i = 0; i < iv.size(); ++i) iv[i] = (int64_t{1} << 40) + static_cast<int64_t>(i) * 7919;
    OpCase ic{"transpose2", {{"X", i64_tensor(k.x, iv)}}, {"Out"}, {{"axis", k.perm}}};
    const Tensor o = run_forward(ic)["Out"];
    REQUIRE(o.dtype() == DType::i64);
    const std::vector<int64_t> got(o.data<int64_t>(), o.data<int64_t>() + o.numel());
    CHECK(got == ref_transpose(iv, k.x, k.perm));
  }
}

TEST_CASE("transpose2: the copy plan merges dims and keeps contiguous runs", "[ops][transformer][transpose2]") {
  auto plan = [](Shape x, std::vector<int64_t> perm) {
    return fn::make_transpose_plan(x.data(), perm.data(), static_cast<int>(x.size()));
  };
  // [B, T, H, hd] -> [B, H, T, hd]: four dims, hd-long runs contiguous on both sides.
  fn::TransposePlan p = plan({2, 3, 4, 5}, {0, 2, 1, 3});
  CHECK(p.ndim == 4);
  CHECK(p.inner_contiguous());
  CHECK(p.out_dims[3] == 5);
  // Identity: one run of everything.
  p = plan({2, 3, 4}, {0, 1, 2});
  CHECK(p.ndim == 1);
  CHECK(p.out_dims[0] == 24);
  // [B, T, H, hd] -> [B, T, hd, H] with B and T adjacent on both sides: merged.
  p = plan({2, 3, 4, 5}, {0, 1, 3, 2});
  CHECK(p.ndim == 3);
  CHECK(p.out_dims[0] == 6);
  CHECK(!p.inner_contiguous());
  // src_offset agrees with the definition.
  p = plan({2, 3, 4, 5}, {3, 1, 0, 2});
  const std::vector<int64_t> perm = {3, 1, 0, 2};
  std::vector<int64_t> iota(120);
  std::iota(iota.begin(), iota.end(), 0);
  const std::vector<int64_t> ref = ref_transpose(iota, {2, 3, 4, 5}, perm);
  for (int64_t o = 0; o < 120; ++o) CHECK(p.src_offset(o) == ref[static_cast<size_t>(o)]);
}

namespace {

// Distinct values of E, none equal to `kUnwritten`.
template <typename E>
std::vector<E> distinct_values(size_t n) {
  std::vector<E> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<E>(3 + 5 * i);
  return v;
}
template <typename E>
constexpr E kUnwritten = static_cast<E>(1);

// gather_cpu and scatter_cpu with elements of E: a permutation's scatter
// undoes its gather, and a strided view's (conv2d's sampled pixels) reaches
// exactly the view's elements.
template <typename E>
void check_strided_copies() {
  const size_t es = sizeof(E);
  for (const TrCfg& k : kTrCases) {
    INFO("X" << shape_str(k.x) << " axis " << shape_str(k.perm) << ", " << es << "-byte elements");
    const fn::TransposePlan plan = fn::make_transpose_plan(k.x.data(), k.perm.data(), static_cast<int>(k.x.size()));
    const std::vector<E> x = distinct_values<E>(static_cast<size_t>(shape_numel(k.x)));
    const auto n = static_cast<int64_t>(x.size());
    std::vector<E> out(x.size()), back(x.size(), kUnwritten<E>);
    transpose_rules::gather_cpu(x.data(), out.data(), plan, n, es);
    CHECK(out == ref_transpose(x, k.x, k.perm));
    transpose_rules::scatter_cpu(out.data(), back.data(), plan, n, es);
    CHECK(back == x);
  }
  // Rows 0, 2, 4 and columns 0, 3, 6 of [2, 5, 7, 3] (pixels of 3 channels),
  // as a stride-(2, 3) 1x1 convolution samples them.
  const int64_t n = 2, h = 5, w = 7, c = 3, sh = 2, sw = 3, oh = 3, ow = 3;
  const int64_t dims[4] = {n, oh, ow, c};
  const int64_t strides[4] = {h * w * c, sh * w * c, sw * c, 1};
  const fn::TransposePlan view = fn::make_view_plan(dims, strides, 4);
  const std::vector<E> x = distinct_values<E>(static_cast<size_t>(n * h * w * c));
  std::vector<E> sampled(static_cast<size_t>(n * oh * ow * c));
  transpose_rules::gather_cpu(x.data(), sampled.data(), view, static_cast<int64_t>(sampled.size()), es);
  std::vector<E> want_sampled, want_back(x.size(), kUnwritten<E>);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j)
        for (int64_t ch = 0; ch < c; ++ch) {
          const auto at = static_cast<size_t>(((b * h + i * sh) * w + j * sw) * c + ch);
          want_sampled.push_back(x[at]);
          want_back[at] = x[at];
        }
  CHECK(sampled == want_sampled);
  std::vector<E> back(x.size(), kUnwritten<E>);
  transpose_rules::scatter_cpu(sampled.data(), back.data(), view, static_cast<int64_t>(sampled.size()), es);
  CHECK(back == want_back);
}

}  // namespace

TEST_CASE("strided copies on the CPU: a scatter undoes its gather; a view reaches only its elements",
          "[ops][transformer][transpose2]") {
  check_strided_copies<uint16_t>();
  check_strided_copies<uint32_t>();
  check_strided_copies<uint64_t>();
}

TEST_CASE("grad: transpose2, 4-D and 5-D permutations", "[grad][transformer][transpose2]") {
  uint64_t seed = 120;
  for (const TrCfg& k : kTrCases)
    check_all(OpCase{"transpose2", {{"X", uniform_tensor(k.x, ++seed)}}, {"Out"}, {{"axis", k.perm}}});
}

TEST_CASE("transpose2: a non-permutation axis names the problem", "[ops][transformer][transpose2][errors]") {
  auto fails = [](std::vector<int64_t> axis, const std::string& text) {
    OpCase c{"transpose2", {{"X", uniform_tensor({2, 3, 4}, 1)}}, {"Out"}, {{"axis", axis}}};
    INFO(c.describe());
    CHECK_THROWS_AS(run_forward(c), Error);
    CHECK_THROWS_WITH(run_forward(c), Contains(text));
  };
  fails({0, 1, 1}, "not a permutation");
  fails({0, 3, 1}, "not a permutation");
  fails({0, -1, 1}, "not a permutation");
  fails({1, 0}, "has 2 entries but X has 3 dims");
  OpCase none{"transpose2", {{"X", uniform_tensor({2, 3}, 1)}}, {"Out"}};
  CHECK_THROWS_WITH(run_forward(none), Contains("'axis'") && Contains("required"));
}

// ---- split --------------------------------------------------------------------------------

namespace {

// Part k of X along `axis` in double (the definition: a slice).
std::vector<std::vector<float>> ref_split(const std::vector<float>& x, const Shape& xs, size_t axis,
                                          const std::vector<int64_t>& sizes) {
  std::vector<std::vector<float>> parts;
  int64_t start = 0;
  for (int64_t sz : sizes) {
    Shape ps = xs;
    ps[axis] = sz;
    std::vector<float> part(static_cast<size_t>(shape_numel(ps)));
    for (int64_t i = 0; i < static_cast<int64_t>(part.size()); ++i) {
      std::vector<int64_t> idx = unravel(i, ps);
      idx[axis] += start;
      part[static_cast<size_t>(i)] = x[static_cast<size_t>(ravel(idx, xs))];
    }
    parts.push_back(part);
    start += sz;
  }
  return parts;
}

OpCase split_case(const Shape& x, int64_t axis, std::map<std::string, Attr> how, size_t parts, uint64_t seed) {
  how["axis"] = axis;
  OpCase c{"split", {{"X", uniform_tensor(x, seed)}}, {"Out"}, how};
  c.list_outputs = {{"Out", parts}};
  return c;
}

}  // namespace

TEST_CASE("split: num and sections against slices, any dtype", "[ops][transformer][split]") {
  struct Cfg {
    Shape x;
    int64_t axis;
    std::map<std::string, Attr> how;
    std::vector<int64_t> sizes;
  };
  const Cfg cases[] = {
      {{2, 3, 12}, -1, {{"num", int64_t{3}}}, {4, 4, 4}},  // qkv [B, T, 3D]
      {{2, 3, 12}, 2, {{"num", int64_t{3}}}, {4, 4, 4}},
      {{4, 3, 2}, 0, {{"num", int64_t{2}}}, {2, 2}},
      {{2, 7, 3}, 1, {{"sections", std::vector<int64_t>{2, 4, 1}}}, {2, 4, 1}},
      {{2, 7, 3}, -2, {{"sections", std::vector<int64_t>{3, -1}}}, {3, 4}},
      {{5, 6}, 1, {{"sections", std::vector<int64_t>{0, 6}}}, {0, 6}},  // an empty part
  };
  uint64_t seed = 140;
  for (const Cfg& k : cases) {
    OpCase c = split_case(k.x, k.axis, k.how, k.sizes.size(), ++seed);
    INFO(c.describe());
    const size_t axis = static_cast<size_t>(k.axis < 0 ? k.axis + static_cast<int64_t>(k.x.size()) : k.axis);
    for (DType dt : {DType::f32, DType::bf16}) {
      auto out = run_forward(c, dt);
      const auto ref = ref_split(rounded_through(c.inputs[0].value, dt).to_floats(), k.x, axis, k.sizes);
      for (size_t i = 0; i < k.sizes.size(); ++i) {
        const Tensor& o = out["Out#" + std::to_string(i)];
        CHECK(o.dtype() == dt);
        CHECK(o.dim(static_cast<int>(axis)) == k.sizes[i]);
        expect_close(o.to_floats(), doubles(ref[i]), {0, 0}, "part " + std::to_string(i));
      }
    }
  }
  // i64 parts: bytes copied, not floats.
  std::vector<int64_t> iv(24);
  for (size_t i = 0; i < iv.size(); ++i) iv[i] = (int64_t{1} << 50) + static_cast<int64_t>(i);
  OpCase ic{"split", {{"X", i64_tensor({2, 12}, iv)}}, {"Out"}, {{"axis", int64_t{1}}, {"num", int64_t{3}}}};
  ic.list_outputs = {{"Out", 3}};
  auto out = run_forward(ic);
  const Tensor& mid = out["Out#1"];
  REQUIRE(mid.dtype() == DType::i64);
  CHECK(std::vector<int64_t>(mid.data<int64_t>(), mid.data<int64_t>() + 8) ==
        std::vector<int64_t>{iv[4], iv[5], iv[6], iv[7], iv[16], iv[17], iv[18], iv[19]});
}

TEST_CASE("grad: split, num and sections, with an unused output", "[grad][transformer][split]") {
  check_all(split_case({2, 3, 12}, -1, {{"num", int64_t{3}}}, 3, 160));
  check_all(split_case({2, 7, 3}, 1, {{"sections", std::vector<int64_t>{2, 4, 1}}}, 3, 161));
  // Out#1 is consumed by nothing: no gradient flows into it, and its part of
  // X@GRAD must be zeros (central differences see no dependence either).
  OpCase unused = split_case({2, 7, 3}, 1, {{"sections", std::vector<int64_t>{2, -1, 1}}}, 3, 162);
  unused.project = {"Out#0", "Out#2"};
  check_all(unused);
  OpCase first_unused = split_case({3, 6}, 1, {{"num", int64_t{3}}}, 3, 163);
  first_unused.project = {"Out#2"};
  check_gradients_fd(first_unused);
  // The zeros really are zeros: d/dX of the unused middle part is exactly 0.
  auto b = build_case(unused, DType::f32);
  const RunResult res = run_case(*b, unused.inputs, make_projections(*b, unused, DType::f16, 3), true);
  const std::vector<float> dx = res.grads[0].to_floats();
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t t = 2; t < 6; ++t)
      for (int64_t j = 0; j < 3; ++j) CHECK(dx[static_cast<size_t>((i * 7 + t) * 3 + j)] == 0.f);
}

TEST_CASE("split: bad attrs name the problem", "[ops][transformer][split][errors]") {
  auto fails = [](OpCase c, const std::string& text) {
    INFO(c.describe());
    CHECK_THROWS_AS(run_forward(c), Error);
    CHECK_THROWS_WITH(run_forward(c), Contains(text));
  };
  fails(split_case({2, 7}, 1, {{"num", int64_t{3}}}, 3, 1), "num 3 does not divide dim 1");
  fails(split_case({2, 6}, 1, {{"sections", std::vector<int64_t>{2, 3}}}, 2, 1), "add up to 5 but dim 1");
  fails(split_case({2, 6}, 1, {{"num", int64_t{2}}}, 3, 1), "lists 3 variables but the attrs make 2 parts");
  fails(split_case({2, 6}, 1, {}, 2, 1), "set num");
  fails(split_case({2, 6}, 2, {{"num", int64_t{2}}}, 2, 1), "axis 2 is out of range");
}

// ---- dropout ------------------------------------------------------------------------------

namespace {

struct DropoutOut {
  Tensor out, mask;
};

// One dropout op run with the given step, rank and mode.
DropoutOut run_dropout(const Tensor& x, std::map<std::string, Attr> attrs, int64_t step = 1, int rank = 0,
                       bool training = true, const std::string& out_name = "drop_out", DType dt = DType::f32) {
  Program p;
  VarDesc v = var_desc("x", x.shape(), dt);
  v.stop_gradient = true;
  p.add_var(v);
  p.append_op(make_op("dropout", {{"X", {"x"}}}, {{"Out", {out_name}}, {"Mask", {"mask"}}}, attrs));
  Scope scope;
  scope.set("x", to_dtype(x, dt));
  ExecEnv env;
  env.step = step;
  env.rank = rank;
  env.training = training;
  Executor(p, {out_name, "mask"}).run(scope, env);
  return {scope.get(out_name), scope.get("mask")};
}

std::vector<uint8_t> mask_of(const DropoutOut& d) {
  REQUIRE(d.mask.dtype() == DType::u8);
  return {d.mask.data<uint8_t>(), d.mask.data<uint8_t>() + d.mask.numel()};
}

}  // namespace

TEST_CASE("dropout: kept fraction, Out = X * mask / (1 - p)", "[ops][transformer][dropout]") {
  const int64_t n = int64_t{1} << 20;
  const Tensor x = uniform_tensor({n / 1024, 1024}, 5, -2.f, 2.f);
  for (double p : {0.1, 0.3, 0.5}) {
    INFO("p = " << p);
    const DropoutOut d = run_dropout(x, {{"dropout_prob", p}, {"seed", int64_t{42}}});
    const std::vector<uint8_t> m = mask_of(d);
    // If the mask bits were independent Bernoulli(1 - p), the kept count K is
    // Binomial(n, 1 - p) with sd = sqrt(n p (1 - p)) (~470 for n = 2^20, p = 0.3).
    // A correct mask falls outside 6 sd with probability ~2e-9; a wrong keep
    // test (u < p, or p applied as the keep rate) misses by ~0.2n = 40 000 sd.
    // The same bound on the even and on the odd elements (n/2 each) catches a
    // hash whose bits alternate with the index.
    auto within = [&](int64_t count, int64_t total) {
      const double sd = std::sqrt(static_cast<double>(total) * p * (1 - p));
      return std::fabs(static_cast<double>(count) - static_cast<double>(total) * (1 - p)) <= 6 * sd;
    };
    int64_t kept = 0, kept_even = 0, not_bit = 0;
    for (int64_t i = 0; i < n; ++i) {
      not_bit += m[static_cast<size_t>(i)] > 1;
      kept += m[static_cast<size_t>(i)];
      if (i % 2 == 0) kept_even += m[static_cast<size_t>(i)];
    }
    CHECK(not_bit == 0);
    CHECK(within(kept, n));
    CHECK(within(kept_even, n / 2));
    CHECK(within(kept - kept_even, n / 2));
    // Neighbours are independent: of the n/2 disjoint pairs (2i, 2i + 1), both
    // are kept in Binomial(n/2, (1 - p)^2) of them. A hash that gave a pair one
    // bit would keep both in (1 - p) n/2, ~p (1 - p) n/2 = 110 000 more for
    // p = 0.3, some 300 sd; 6 sd as above.
    int64_t both = 0;
    for (int64_t i = 0; i + 1 < n; i += 2) both += m[static_cast<size_t>(i)] & m[static_cast<size_t>(i + 1)];
    const double q = (1 - p) * (1 - p), pairs = static_cast<double>(n / 2);
    CHECK(std::fabs(static_cast<double>(both) - pairs * q) <= 6 * std::sqrt(pairs * q * (1 - q)));
    // Out = X * mask / (1 - p): exact for p = 0.5 (a scale of 2); otherwise the
    // float scale 1/(1-p) and the product are each rounded once: within 2^-23
    // relative of the double quotient.
    const std::vector<float> xv = x.to_floats(), ov = d.out.to_floats();
    std::vector<double> ref(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) ref[i] = m[i] ? xv[i] / (1.0 - p) : 0.0;
    expect_close(ov, ref, {0, p == 0.5 ? 0.0 : 2.4e-7}, "Out = X * mask / (1 - p)");
    int64_t dropped_nonzero = 0;
    for (size_t i = 0; i < xv.size(); ++i) dropped_nonzero += !m[i] && ov[i] != 0.f;
    CHECK(dropped_nonzero == 0);
  }
}

TEST_CASE("dropout: the mask is a function of (seed, step, rank, op)", "[ops][transformer][dropout]") {
  const Tensor x = uniform_tensor({64, 64}, 6);
  const std::map<std::string, Attr> a{{"dropout_prob", 0.5}, {"seed", int64_t{7}}};
  const std::vector<uint8_t> base = mask_of(run_dropout(x, a, 3, 0));
  CHECK(mask_of(run_dropout(x, a, 3, 0)) == base);  // the same key: the same mask
  // Each differing field gives another mask; two independent p = 0.5 masks of
  // 4096 elements agree on ~2048 (sd 32), never on more than 2400.
  auto agreement = [&](const std::vector<uint8_t>& m) {
    int64_t same = 0;
    for (size_t i = 0; i < m.size(); ++i) same += m[i] == base[i];
    return same;
  };
  std::map<std::string, Attr> other_seed = a;
  other_seed["seed"] = int64_t{8};
  CHECK(agreement(mask_of(run_dropout(x, a, 4, 0))) < 2400);                     // next step
  CHECK(agreement(mask_of(run_dropout(x, other_seed, 3, 0))) < 2400);            // seed
  CHECK(agreement(mask_of(run_dropout(x, a, 3, 1))) < 2400);                     // rank
  CHECK(agreement(mask_of(run_dropout(x, a, 3, 0, true, "other_out"))) < 2400);  // another dropout op
  // The mask depends on the element index only, not on X's values or dtype.
  CHECK(mask_of(run_dropout(uniform_tensor({64, 64}, 99), a, 3, 0)) == base);
  CHECK(mask_of(run_dropout(x, a, 3, 0, true, "drop_out", DType::f16)) == base);
  // The stateless function itself: (key, i) alone decides.
  const uint64_t key = fn::dropout_key(7, 3, 0, 12345);
  CHECK(fn::dropout_key(7, 3, 0, 12345) == key);
  CHECK(fn::dropout_key(7, 3, 0, 12346) != key);
  CHECK(fn::dropout_keep(key, 10, 0.f));  // p = 0 keeps everything
  const float u = fn::dropout_uniform(key, 10);
  CHECK((u >= 0.f && u < 1.f));
  CHECK(fn::dropout_keep(key, 10, u) == true);
  CHECK(fn::dropout_keep(key, 10, std::nextafter(u, 1.f)) == false);
}

TEST_CASE("dropout: evaluation, is_test and p = 0 are the identity", "[ops][transformer][dropout]") {
  const Tensor x = uniform_tensor({8, 16}, 8);
  const std::vector<float> xv = x.to_floats();
  for (int mode = 0; mode < 3; ++mode) {
    INFO("mode " << mode);
    std::map<std::string, Attr> a{{"dropout_prob", mode == 2 ? 0.0 : 0.4}};
    if (mode == 1) a["is_test"] = true;
    const DropoutOut d = run_dropout(x, a, 1, 0, mode != 0);
    CHECK(d.out.to_floats() == xv);
    for (uint8_t m : mask_of(d)) CHECK(m == 1);
  }
  // FP16 evaluation copies the bits.
  const DropoutOut h = run_dropout(x, {{"dropout_prob", 0.4}}, 1, 0, false, "drop_out", DType::f16);
  CHECK(h.out.dtype() == DType::f16);
  CHECK(h.out.to_floats() == rounded_through(x, DType::f16).to_floats());
}

TEST_CASE("grad: dropout in training with a fixed seed", "[grad][transformer][dropout]") {
  for (double p : {0.2, 0.5}) {
    OpCase c{"dropout",
             {{"X", uniform_tensor({4, 6}, 9)}},
             {"Out", "Mask"},
             {{"dropout_prob", p}, {"seed", int64_t{3}}},
             {"Out"}};
    check_all(c);
  }
}

TEST_CASE("dropout: bad probabilities and implementations name the problem", "[ops][transformer][dropout][errors]") {
  auto fails = [](std::map<std::string, Attr> a, const std::string& text) {
    OpCase c{"dropout", {{"X", uniform_tensor({2, 3}, 1)}}, {"Out", "Mask"}, a};
    INFO(c.describe());
    CHECK_THROWS_AS(run_forward(c), Error);
    CHECK_THROWS_WITH(run_forward(c), Contains(text));
  };
  fails({{"dropout_prob", 1.0}}, "dropout_prob 1 must be in [0, 1)");
  fails({{"dropout_prob", -0.1}}, "dropout_prob -0.1 must be in [0, 1)");
  fails({{"dropout_prob", 0.1}, {"dropout_implementation", std::string("downgrade_in_infer")}},
        "'downgrade_in_infer' is not supported");
  OpCase no_mask{"dropout", {{"X", uniform_tensor({2, 3}, 1)}}, {"Out"}, {{"dropout_prob", 0.1}}};
  CHECK_THROWS_WITH(run_forward(no_mask), Contains("Mask is required in training"));
}

// ---- softmax, causal ------------------------------------------------------------------------

namespace {

// Causal softmax in double over X [..., T, S]: query i sees keys j <= i + S - T.
std::vector<double> ref_causal_softmax(const std::vector<float>& x, int64_t t, int64_t s) {
  std::vector<double> y(x.size(), 0.0);
  for (int64_t r = 0; r < static_cast<int64_t>(x.size()) / s; ++r) {
    const int64_t valid = r % t + s - t + 1;
    double mx = -INFINITY, z = 0;
    for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, static_cast<double>(x[r * s + j]));
    for (int64_t j = 0; j < valid; ++j) z += std::exp(x[r * s + j] - mx);
    for (int64_t j = 0; j < valid; ++j) y[r * s + j] = std::exp(x[r * s + j] - mx) / z;
  }
  return y;
}

}  // namespace

TEST_CASE("softmax causal: masked keys get exactly 0, rows sum to 1", "[ops][transformer][softmax]") {
  for (Shape s : {Shape{2, 3, 5, 5}, Shape{2, 2, 3, 6}, Shape{4, 4}, Shape{1, 1}}) {
    const int64_t t = s[s.size() - 2], k = s.back();
    const Tensor x = uniform_tensor(s, 11 + static_cast<uint64_t>(t * k), -4.f, 4.f);
    OpCase c{"softmax", {{"X", x}}, {"Out"}, {{"causal", true}, {"axis", int64_t{-1}}}};
    INFO(c.describe());
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
      const std::vector<float> y = run_forward(c, dt)["Out"].to_floats();
      const std::vector<double> ref = ref_causal_softmax(rounded_through(x, dt).to_floats(), t, k);
      const double u = dt == DType::f32 ? 1e-6 : dt == DType::f16 ? 1e-3 : 8e-3;
      expect_close(y, ref, {1e-6, u}, "causal softmax " + std::string(dtype_name(dt)));
      for (size_t i = 0; i < y.size(); ++i)
        if (ref[i] == 0.0) REQUIRE(y[i] == 0.f);  // exactly 0, not tiny
    }
  }
  // Without causal nothing is masked (the attr defaults to false).
  OpCase plain{"softmax", {{"X", uniform_tensor({3, 3}, 2)}}, {"Out"}};
  for (float v : run_forward(plain)["Out"].to_floats()) CHECK(v > 0.f);
}

TEST_CASE("grad: softmax causal, T == S and T < S", "[grad][transformer][softmax]") {
  check_all(OpCase{"softmax", {{"X", uniform_tensor({2, 4, 4}, 21, -2.f, 2.f)}}, {"Out"}, {{"causal", true}}});
  check_all(OpCase{"softmax", {{"X", uniform_tensor({2, 2, 3, 5}, 22, -2.f, 2.f)}}, {"Out"}, {{"causal", true}}});
}

TEST_CASE("softmax causal: more queries than keys is refused", "[ops][transformer][softmax][errors]") {
  OpCase c{"softmax", {{"X", uniform_tensor({2, 5, 3}, 1)}}, {"Out"}, {{"causal", true}}};
  CHECK_THROWS_AS(run_forward(c), Error);
  CHECK_THROWS_WITH(run_forward(c), Contains("T = 5 > S = 3"));
  OpCase one_d{"softmax", {{"X", uniform_tensor({4}, 1)}}, {"Out"}, {{"causal", true}}};
  CHECK_THROWS_WITH(run_forward(one_d), Contains("[..., T, S]"));
}
