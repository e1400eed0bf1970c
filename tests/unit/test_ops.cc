// Forward values of every op in runtime/ops/ against hand-computed or
// closed-form results (in double), in f32 and f16 (bf16 where it is free),
// the build-time shape inference (including -1 batch dims), and the errors
// users see. Gradients are checked in test_ops_grad.cc.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/half.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/gradcheck.h"
#include "tests/unit/padded_classes_check.h"

using namespace mix;
using namespace mix::testing;
using Catch::Matchers::Contains;

namespace {

Tensor t(const Shape& s, const std::vector<float>& v) { return Tensor::from_floats(s, v); }
std::vector<float> rounded(const Tensor& x, DType dt) { return rounded_through(x, dt).to_floats(); }

// Small-integer arithmetic is exact in every dtype used here; 1e-6 only absorbs
// the last bit where a result is not an integer (0.5 * ..., 1.5, ...).
constexpr Tolerance kExact{1e-6, 1e-6};
// f32 kernels against double references: FP32 accumulation over short rows
// (K <= 16) and libm's float functions give errors of a few ulps (~1e-7 rel).
constexpr Tolerance kF32{1e-5, 1e-5};
// An f16 output against the double result on the same (f16-exact) inputs:
// one rounding on store, u = 2^-11 relative, plus FP32 arithmetic before it.
constexpr Tolerance kF16Out{1e-4, 1e-3};

// Reference matmul in double on the logical (post-transpose) matrices.
std::vector<double> ref_matmul(const std::vector<float>& x, const std::vector<float>& y, int64_t batch, bool y_shared,
                               int64_t m, int64_t k, int64_t n, bool tx, bool ty, double alpha) {
  std::vector<double> out(static_cast<size_t>(batch * m * n));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0.0;
        for (int64_t p = 0; p < k; ++p) {
          const double xv = x[b * m * k + (tx ? p * m + i : i * k + p)];
          const int64_t yb = y_shared ? 0 : b * k * n;
          const double yv = y[yb + (ty ? j * k + p : p * n + j)];
          s += xv * yv;
        }
        out[b * m * n + i * n + j] = alpha * s;
      }
  return out;
}

}  // namespace

// ---- build ---------------------------------------------------------------------------

namespace {
// Not inlined, inputs from memory: the compiler sees a * b + c, as in a kernel loop.
[[gnu::noinline]] float mul_add(const std::vector<float>& v) { return v[0] * v[1] + v[2]; }
}  // namespace

TEST_CASE("the CPU build rounds a multiply before an add (no FMA contraction)", "[ops][build]") {
  // (1 + 2^-13)^2 = 1 + 2^-12 + 2^-26: the product rounds to 1 + 2^-12, so the
  // sum is 0; an FMA would keep the 2^-26. The GPU kernels' bit-identity with
  // the CPU's (test_cuda_ops) needs the rounded product on every host: GCC
  // contracts wherever the target has FMA unless told not to (CMakeLists.txt).
  const float a = 1.f + 0x1p-13f;
  CHECK(mul_add({a, a, -(1.f + 0x1p-12f)}) == 0.f);
}

// ---- matmul ------------------------------------------------------------------------

TEST_CASE("matmul: 2-D product by hand", "[ops][matmul]") {
  OpCase c{"matmul", {{"X", t({2, 2}, {1, 2, 3, 4})}, {"Y", t({2, 2}, {5, 6, 7, 8})}}, {"Out"}};
  expect_close(run_forward(c)["Out"].to_floats(), {19, 22, 43, 50}, kExact, "X.Y");
  c.attrs = {{"transpose_X", true}, {"alpha", 0.5}};  // 0.5 * X^T Y = 0.5 * [[26, 30], [38, 44]]
  expect_close(run_forward(c)["Out"].to_floats(), {13, 15, 19, 22}, kExact, "0.5 X^T.Y");
  c.attrs = {{"transpose_Y", true}};  // X Y^T = [[17, 23], [39, 53]]
  expect_close(run_forward(c)["Out"].to_floats(), {17, 23, 39, 53}, kExact, "X.Y^T");
}

TEST_CASE("matmul: batched, shared Y, transposes and alpha against a double reference", "[ops][matmul]") {
  struct Shp {
    Shape x, y;
  };
  const int64_t m = 3, k = 5, n = 4;
  for (int tx = 0; tx < 2; ++tx)
    for (int ty = 0; ty < 2; ++ty)
      for (int mode = 0; mode < 4; ++mode) {
        // mode 0: 2-D; 1: [2] batch with batched Y; 2: [2, 2] batch with shared 2-D Y; 3: [2, 3] batched
        Shape batch = mode == 0 ? Shape{} : mode == 1 ? Shape{2} : mode == 2 ? Shape{2, 2} : Shape{2, 3};
        const bool shared = mode == 0 || mode == 2;
        Shape xs = batch, ys = shared ? Shape{} : batch;
        xs.push_back(tx ? k : m), xs.push_back(tx ? m : k);
        ys.push_back(ty ? n : k), ys.push_back(ty ? k : n);
        const double alpha = mode == 3 ? -1.5 : 1.0;
        const Tensor x = uniform_tensor(xs, 10 + mode), y = uniform_tensor(ys, 20 + mode);
        OpCase c{"matmul", {{"X", x}, {"Y", y}}, {"Out"},
                 {{"transpose_X", tx == 1}, {"transpose_Y", ty == 1}, {"alpha", alpha}}};
        INFO(c.describe());
        const int64_t count = shape_numel(batch);
        Shape out_shape = batch;
        out_shape.push_back(m), out_shape.push_back(n);
        auto out = run_forward(c)["Out"];
        CHECK(out.shape() == out_shape);
        expect_close(out.to_floats(), ref_matmul(x.to_floats(), y.to_floats(), count, shared, m, k, n, tx, ty, alpha),
                     kF32, "matmul f32");
        // f16: inputs rounded to f16, FP32 accumulation, one rounding of the result.
        auto out16 = run_forward(c, DType::f16)["Out"];
        CHECK(out16.dtype() == DType::f16);
        expect_close(out16.to_floats(),
                     ref_matmul(rounded(x, DType::f16), rounded(y, DType::f16), count, shared, m, k, n, tx, ty, alpha),
                     kF16Out, "matmul f16");
      }
}

TEST_CASE("matmul: FP32 accumulation of FP16 inputs", "[ops][matmul]") {
  // 4096 products of 1 * 1: FP16 accumulation would stall at 2048 (2048 + 1 rounds back
  // to 2048); FP32 accumulation reaches 4096, which FP16 stores exactly.
  OpCase c{"matmul", {{"X", t({1, 4096}, std::vector<float>(4096, 1.f))}, {"Y", t({4096, 1}, std::vector<float>(4096, 1.f))}},
           {"Out"}};
  CHECK(run_forward(c, DType::f16)["Out"].item_float(0) == 4096.f);
}

TEST_CASE("matmul: shape errors name the problem", "[ops][matmul][errors]") {
  OpCase k_mismatch{"matmul", {{"X", t({2, 3}, std::vector<float>(6))}, {"Y", t({4, 2}, std::vector<float>(8))}}, {"Out"}};
  CHECK_THROWS_AS(run_forward(k_mismatch), Error);
  CHECK_THROWS_WITH(run_forward(k_mismatch), Contains("has K = 3") && Contains("has K = 4"));
  OpCase batch_mismatch{"matmul",
                        {{"X", t({2, 2, 3}, std::vector<float>(12))}, {"Y", t({3, 3, 2}, std::vector<float>(18))}},
                        {"Out"}};
  CHECK_THROWS_WITH(run_forward(batch_mismatch), Contains("batch dims"));
  OpCase one_d{"matmul", {{"X", t({3}, {1, 2, 3})}, {"Y", t({3, 1}, {1, 2, 3})}}, {"Out"}};
  CHECK_THROWS_WITH(run_forward(one_d), Contains("at least 2 dims"));
}

TEST_CASE("matmul: inference keeps -1 batch dims", "[ops][matmul][infer]") {
  Program p;
  p.add_var(var_desc("x", {-1, 7, 8}, DType::f16));
  p.add_var(var_desc("w", {8, 3}, DType::f16));
  p.append_op(make_op("matmul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"o"}}}));
  CHECK(p.var("o").shape == Shape{-1, 7, 3});
  CHECK(p.var("o").dtype == DType::f16);
  p.add_var(var_desc("w32", {8, 3}, DType::f32));
  CHECK_THROWS_WITH(p.append_op(make_op("matmul", {{"X", {"x"}}, {"Y", {"w32"}}}, {{"Out", {"o2"}}})),
                    Contains("f16") && Contains("f32"));
}

// ---- elementwise_add / elementwise_mul --------------------------------------------------

TEST_CASE("elementwise_add: bias broadcast, same shape, axis, trailing ones", "[ops][elementwise]") {
  const Tensor x = t({2, 3}, {1, 2, 3, 4, 5, 6});
  OpCase bias{"elementwise_add", {{"X", x}, {"Y", t({3}, {10, 20, 30})}}, {"Out"}};
  expect_close(run_forward(bias)["Out"].to_floats(), {11, 22, 33, 14, 25, 36}, kExact, "bias [3] + [2, 3]");
  OpCase same{"elementwise_add", {{"X", x}, {"Y", t({2, 3}, {6, 5, 4, 3, 2, 1})}}, {"Out"}};
  expect_close(run_forward(same)["Out"].to_floats(), {7, 7, 7, 7, 7, 7}, kExact, "same shape");
  OpCase axis0{"elementwise_add", {{"X", x}, {"Y", t({2}, {100, 200})}}, {"Out"}, {{"axis", int64_t{0}}}};
  expect_close(run_forward(axis0)["Out"].to_floats(), {101, 102, 103, 204, 205, 206}, kExact, "axis 0");
  // X [2, 3, 2], Y [3, 1] at axis 1: Y's trailing 1 is dropped (Paddle), Y[j] meets X[:, j, :].
  std::vector<float> xv(12);
  for (int i = 0; i < 12; ++i) xv[i] = static_cast<float>(i);
  OpCase trail{"elementwise_add", {{"X", t({2, 3, 2}, xv)}, {"Y", t({3, 1}, {10, 20, 30})}}, {"Out"},
               {{"axis", int64_t{1}}}};
  expect_close(run_forward(trail)["Out"].to_floats(), {10, 11, 22, 23, 34, 35, 16, 17, 28, 29, 40, 41}, kExact,
               "trailing ones");
  // Leading ones broadcast (PyTorch's bias [1, C]); a Y of all ones is a scalar.
  OpCase lead{"elementwise_add", {{"X", x}, {"Y", t({1, 3}, {10, 20, 30})}}, {"Out"}};
  expect_close(run_forward(lead)["Out"].to_floats(), {11, 22, 33, 14, 25, 36}, kExact, "bias [1, 3]");
  OpCase scalar{"elementwise_add", {{"X", x}, {"Y", t({1}, {0.5f})}}, {"Out"}};
  expect_close(run_forward(scalar)["Out"].to_floats(), {1.5, 2.5, 3.5, 4.5, 5.5, 6.5}, kExact, "scalar [1]");
  // f16 and bf16: small integers are exact, so the sums are too.
  for (DType dt : {DType::f16, DType::bf16}) {
    auto o = run_forward(bias, dt)["Out"];
    CHECK(o.dtype() == dt);
    expect_close(o.to_floats(), {11, 22, 33, 14, 25, 36}, kExact, std::string("bias in ") + std::string(dtype_name(dt)));
  }
}

TEST_CASE("elementwise_mul: broadcast values", "[ops][elementwise]") {
  const Tensor x = t({2, 3}, {1, 2, 3, 4, 5, 6});
  OpCase c{"elementwise_mul", {{"X", x}, {"Y", t({3}, {2, -1, 0.5f})}}, {"Out"}};
  expect_close(run_forward(c)["Out"].to_floats(), {2, -2, 1.5, 8, -5, 3}, kExact, "[2, 3] * [3]");
  OpCase same{"elementwise_mul", {{"X", x}, {"Y", x}}, {"Out"}};
  expect_close(run_forward(same)["Out"].to_floats(), {1, 4, 9, 16, 25, 36}, kExact, "x * x");
  // f16 rounds the product on store: 1.1 * 1.1 = 1.21 -> nearest half.
  OpCase r{"elementwise_mul", {{"X", t({1}, {1.1f})}, {"Y", t({1}, {1.1f})}}, {"Out"}};
  const float h = round_to_half(1.1f);
  CHECK(run_forward(r, DType::f16)["Out"].item_float(0) == round_to_half(h * h));
}

TEST_CASE("dtype names: ours, safetensors' and the common aliases parse; others are refused", "[dtype]") {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    CHECK(parse_dtype(dtype_name(t)) == t);
    CHECK(parse_dtype(dtype_safetensors_name(t)) == t);
  }
  CHECK(parse_dtype("F16") == DType::f16);
  CHECK(parse_dtype("half") == DType::f16);
  CHECK(parse_dtype("float16") == DType::f16);
  CHECK(parse_dtype("float") == DType::f32);
  CHECK(parse_dtype("float32") == DType::f32);
  CHECK(parse_dtype("bfloat16") == DType::bf16);
  CHECK_THROWS_WITH(parse_dtype("fp8"), Catch::Contains("unknown dtype 'fp8'"));
}

TEST_CASE("elementwise ops: mismatched shapes and dtypes are errors", "[ops][elementwise][errors]") {
  OpCase bad{"elementwise_add", {{"X", t({2, 3}, std::vector<float>(6))}, {"Y", t({4}, std::vector<float>(4))}}, {"Out"}};
  CHECK_THROWS_AS(run_forward(bad), Error);
  CHECK_THROWS_WITH(run_forward(bad), Contains("does not match X [2, 3]"));
  OpCase bigger{"elementwise_mul", {{"X", t({3}, std::vector<float>(3))}, {"Y", t({2, 3}, std::vector<float>(6))}},
                {"Out"}};
  CHECK_THROWS_WITH(run_forward(bigger), Contains("more dims than X"));
  OpCase axis{"elementwise_add", {{"X", t({2, 3}, std::vector<float>(6))}, {"Y", t({3}, std::vector<float>(3))}},
              {"Out"}, {{"axis", int64_t{2}}}};
  CHECK_THROWS_WITH(run_forward(axis), Contains("axis 2"));
  Program p;
  p.add_var(var_desc("x", {-1, 4}, DType::f16));
  p.add_var(var_desc("b", {4}, DType::f32));
  CHECK_THROWS_WITH(p.append_op(make_op("elementwise_add", {{"X", {"x"}}, {"Y", {"b"}}}, {{"Out", {"o"}}})),
                    Contains("X is f16 but Y is f32"));
  // A narrower Y beside an f32 X only where it has X's shape.
  p.add_var(var_desc("x32", {-1, 4}, DType::f32));
  p.add_var(var_desc("bias16", {4}, DType::f16));
  CHECK_THROWS_WITH(p.append_op(make_op("elementwise_add", {{"X", {"x32"}}, {"Y", {"bias16"}}}, {{"Out", {"o"}}})),
                    Contains("must have X's shape"));
  // A -1 batch dim matches at build time.
  p.add_var(var_desc("b16", {4}, DType::f16));
  p.append_op(make_op("elementwise_add", {{"X", {"x"}}, {"Y", {"b16"}}}, {{"Out", {"o"}}}));
  CHECK(p.var("o").shape == Shape{-1, 4});
}

// ---- mean ------------------------------------------------------------------------------

TEST_CASE("mean: closed form, output dtype, accuracy over many elements", "[ops][mean]") {
  OpCase c{"mean", {{"X", t({2, 3}, {1, 2, 3, 4, 5, 7})}}, {"Out"}};
  auto o = run_forward(c)["Out"];
  CHECK(o.shape() == Shape{1});
  CHECK(o.item_float(0) == Approx(22.0 / 6.0).epsilon(1e-7));
  auto o16 = run_forward(c, DType::f16)["Out"];
  CHECK(o16.dtype() == DType::f16);
  CHECK(o16.item_float(0) == round_to_half(static_cast<float>(22.0 / 6.0)));
  // 2^20 copies of 0.1f plus one 1e6: an FP32 running sum would lose most of the small
  // terms (2^-4 ulp at 1e6 > 0.1); the double sum keeps them.
  std::vector<float> v(1 << 20, 0.1f);
  v[0] = 1e6f;
  const double expect = (1e6 + (static_cast<double>(v.size()) - 1) * static_cast<double>(0.1f)) / v.size();
  OpCase big{"mean", {{"X", t({static_cast<int64_t>(v.size())}, v)}}, {"Out"}};
  CHECK(run_forward(big)["Out"].item_float(0) == Approx(expect).epsilon(1e-7));
}

// ---- softmax ---------------------------------------------------------------------------

TEST_CASE("softmax: closed form, rows sum to 1, large logits", "[ops][softmax]") {
  // The max subtraction: 1000.. gives the same row, and so does -1000.., whose
  // exponentials exp(x) all underflow to 0 in FP32 (a maximum started at 0
  // instead of -inf would give 0 / 0).
  OpCase c{"softmax", {{"X", t({3, 3}, {1, 2, 3, 1000, 1001, 1002, -1000, -999, -998})}}, {"Out"}};
  const double e1 = std::exp(-2.0), e2 = std::exp(-1.0), s = e1 + e2 + 1.0;
  const std::vector<double> row = {e1 / s, e2 / s, 1.0 / s};
  std::vector<double> expect;
  for (int r = 0; r < 3; ++r) expect.insert(expect.end(), row.begin(), row.end());
  expect_close(run_forward(c)["Out"].to_floats(), expect, kF32, "softmax f32");

  const Tensor x = uniform_tensor({4, 3, 7}, 5, -4.f, 4.f);
  OpCase r{"softmax", {{"X", x}}, {"Out"}, {{"axis", int64_t{2}}}};
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    const std::vector<float> y = run_forward(r, dt)["Out"].to_floats();
    const std::vector<float> xr = rounded(x, dt);
    for (int i = 0; i < 12; ++i) {
      double sum = 0.0, mx = -1e30, z = 0.0;
      for (int k = 0; k < 7; ++k) mx = std::max(mx, static_cast<double>(xr[i * 7 + k]));
      for (int k = 0; k < 7; ++k) z += std::exp(xr[i * 7 + k] - mx);
      std::vector<double> ref(7);
      std::vector<float> got(7);
      for (int k = 0; k < 7; ++k) {
        sum += y[i * 7 + k];
        ref[k] = std::exp(xr[i * 7 + k] - mx) / z;
        got[k] = y[i * 7 + k];
      }
      INFO("dtype " << dtype_name(dt) << ", row " << i);
      // Each value is rounded once on store, by at most u/2 of itself (u the unit
      // roundoff of the dtype), so the row sum is within u/2 of 1, plus FP32 math.
      const double u = dt == DType::f32 ? 6e-8 : dt == DType::f16 ? 4.9e-4 : 3.9e-3;
      CHECK(std::fabs(sum - 1.0) <= u + 1e-6);
      expect_close(got, ref, Tolerance{1e-6, 1.5 * u + 1e-6}, "softmax row");
    }
  }
}

TEST_CASE("softmax: only the last axis", "[ops][softmax][errors]") {
  OpCase c{"softmax", {{"X", t({2, 3}, std::vector<float>(6))}}, {"Out"}, {{"axis", int64_t{0}}}};
  CHECK_THROWS_AS(run_forward(c), Error);
  CHECK_THROWS_WITH(run_forward(c), Contains("only the last axis") && Contains("axis 0"));
}

// ---- softmax_with_cross_entropy ----------------------------------------------------------

TEST_CASE("softmax_with_cross_entropy: closed form loss and softmax", "[ops][cross_entropy]") {
  // Row 0: logits [0, 0, 0] -> loss log 3. Row 1: [1, 2, 3], label 0 -> log(e + e^2 + e^3) - 1.
  // Row 2: [10, -10, 0], label 0 -> log(1 + e^-20 + e^-10).
  const Tensor logits = t({3, 3}, {0, 0, 0, 1, 2, 3, 10, -10, 0});
  for (Shape lshape : {Shape{3, 1}, Shape{3}}) {
    OpCase c{"softmax_with_cross_entropy", {{"Logits", logits}, {"Label", i64_tensor(lshape, {2, 0, 0})}},
             {"Softmax", "Loss"}};
    auto out = run_forward(c);
    CHECK(out["Loss"].shape() == Shape{3, 1});
    CHECK(out["Loss"].dtype() == DType::f32);
    const double l1 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 1.0;
    const double l2 = std::log(1.0 + std::exp(-20.0) + std::exp(-10.0));
    expect_close(out["Loss"].to_floats(), {std::log(3.0), l1, l2}, kF32, "loss");
    const std::vector<float> sm = out["Softmax"].to_floats();
    for (int r = 0; r < 3; ++r) CHECK(sm[r * 3] + sm[r * 3 + 1] + sm[r * 3 + 2] == Approx(1.0).epsilon(1e-6));
    CHECK(sm[0] == Approx(1.0 / 3.0));
  }
}

TEST_CASE("softmax_with_cross_entropy: f16 dtype, extreme logits, ignore_index", "[ops][cross_entropy]") {
  OpCase c{"softmax_with_cross_entropy",
           {{"Logits", t({3, 4}, {0.5f, -1, 2, 0, 30, -30, 0, 0, 1, 1, 1, 1})}, {"Label", i64_tensor({3, 1}, {2, 1, -100})}},
           {"Softmax", "Loss"}};
  auto out = run_forward(c, DType::f16);
  CHECK(out["Loss"].dtype() == DType::f16);
  CHECK(out["Softmax"].dtype() == DType::f16);
  const double l0 = std::log(std::exp(0.5) + std::exp(-1.0) + std::exp(2.0) + 1.0) - 2.0;
  // Row 1: label 1 has softmax e^-60 (0 in f16), yet the loss is the finite 60 (+ log(1 + 2e^-30)).
  const std::vector<float> loss = out["Loss"].to_floats();
  CHECK(loss[0] == Approx(l0).epsilon(1e-3));
  CHECK(loss[1] == Approx(60.0).epsilon(1e-3));
  CHECK(loss[2] == 0.f);  // ignored row
  CHECK(out["Softmax"].item_float(5) == 0.f);
  // The ignored row still gets its softmax (for metrics).
  CHECK(out["Softmax"].item_float(8) == 0.25f);
  // Custom ignore_index.
  c.attrs = {{"ignore_index", int64_t{2}}};
  c.inputs[1].value = i64_tensor({3, 1}, {2, 1, 3});
  auto out2 = run_forward(c);
  CHECK(out2["Loss"].item_float(0) == 0.f);
  CHECK(out2["Loss"].item_float(2) == Approx(std::log(4.0)));
}

TEST_CASE("softmax_with_cross_entropy: bad labels and shapes are errors", "[ops][cross_entropy][errors]") {
  const Tensor logits = uniform_tensor({4, 5}, 3);
  OpCase c{"softmax_with_cross_entropy", {{"Logits", logits}, {"Label", i64_tensor({4, 1}, {0, 4, 5, 1})}},
           {"Softmax", "Loss"}};
  CHECK_THROWS_AS(run_forward(c), Error);
  CHECK_THROWS_WITH(run_forward(c), Contains("label 5 at row 2") && Contains("5 classes"));
  c.inputs[1].value = i64_tensor({4, 1}, {0, -1, 2, 1});
  CHECK_THROWS_WITH(run_forward(c), Contains("label -1 at row 1"));
  c.inputs[1].value = i64_tensor({3, 1}, {0, 1, 2});
  CHECK_THROWS_WITH(run_forward(c), Contains("Label [3, 1] does not match Logits [4, 5]"));
  c.inputs[1].value = t({4, 1}, {0, 1, 2, 3});
  CHECK_THROWS_WITH(run_forward(c), Contains("expected i64"));
  c.inputs[1].value = i64_tensor({4, 1}, {0, 1, 2, 3});
  c.attrs = {{"soft_label", true}};
  CHECK_THROWS_WITH(run_forward(c), Contains("soft_label"));
}

TEST_CASE("softmax_with_cross_entropy and top1_correct: attr valid_classes ignores padding columns, bit for bit",
          "[ops][cross_entropy][top1]") {
  // A vocabulary padded for the GEMMs (GPT-2's 50,257 to 50,304): the padded
  // logits give the unpadded logits' loss, softmax and gradient bits; the
  // padding gets 0 and is never predicted. test_cuda_ops.cc runs the same on the GPU.
  mix::testing::check_padded_classes(cpu_device());
}

// ---- reshape2 ---------------------------------------------------------------------------

TEST_CASE("reshape2: 0 copies, -1 infers, output is a view", "[ops][reshape2]") {
  const Tensor x = uniform_tensor({2, 3, 4}, 9);
  auto shape_of = [&](std::vector<int64_t> attr) {
    OpCase c{"reshape2", {{"X", x}}, {"Out"}, {{"shape", attr}}};
    return run_forward(c)["Out"].shape();
  };
  CHECK(shape_of({0, -1}) == Shape{2, 12});
  CHECK(shape_of({-1, 4}) == Shape{6, 4});
  CHECK(shape_of({0, 0, 2, 2}) == Shape{2, 3, 2, 2});
  CHECK(shape_of({24}) == Shape{24});

  // The kernel's output shares the input's storage.
  Program p;
  p.add_var(var_desc("x", {2, 3, 4}, DType::f32));
  p.append_op(make_op("reshape2", {{"X", {"x"}}}, {{"Out", {"y"}}}, {{"shape", std::vector<int64_t>{4, 6}}}));
  Scope scope;
  scope.set("x", x);
  ExecEnv env;
  Executor(p, {"x", "y"}).run(scope, env);
  CHECK(scope.get("y").shares_storage(scope.get("x")));
  CHECK(scope.get("y").to_floats() == x.to_floats());
}

TEST_CASE("reshape2: inference with -1 batch dims", "[ops][reshape2][infer]") {
  Program p;
  p.add_var(var_desc("x", {-1, 4, 8}, DType::f16));
  auto infer = [&](std::vector<int64_t> attr) {
    p.append_op(make_op("reshape2", {{"X", {"x"}}}, {{"Out", {"y"}}}, {{"shape", attr}}));
    return p.var("y").shape;
  };
  CHECK(infer({0, -1}) == Shape{-1, 32});     // the batch copied, the rest known
  CHECK(infer({0, 2, -1}) == Shape{-1, 2, 16});
  CHECK(infer({-1, 8}) == Shape{-1, 8});      // -1 absorbs the batch: unknown at build time
  CHECK(infer({0, 32}) == Shape{-1, 32});
  CHECK(infer({-1}) == Shape{-1});
  CHECK(p.var("y").dtype == DType::f16);
  CHECK_THROWS_WITH(infer({0, 5, -1}), Contains("cannot reshape X x"));
  CHECK_THROWS_WITH(infer({0, 30}), Contains("cannot reshape X x"));
}

TEST_CASE("reshape2: bad shape attributes are errors", "[ops][reshape2][errors]") {
  const Tensor x = uniform_tensor({2, 3, 4}, 9);
  auto run = [&](std::vector<int64_t> attr) {
    OpCase c{"reshape2", {{"X", x}}, {"Out"}, {{"shape", attr}}};
    return run_forward(c);
  };
  CHECK_THROWS_AS(run({-1, -1}), Error);
  CHECK_THROWS_WITH(run({-1, -1}), Contains("more than one -1"));
  CHECK_THROWS_WITH(run({5, -1}), Contains("cannot reshape"));
  CHECK_THROWS_WITH(run({7, 3}), Contains("cannot reshape"));
  CHECK_THROWS_WITH(run({0, 0, 0, 0}), Contains("copies dim 3"));
  CHECK_THROWS_WITH(run({-2, 12}), Contains("invalid entry -2"));
}

// ---- the lead's ops: mul, cast, scale, sum, activations, fills -------------------------------

TEST_CASE("mul: nn.Linear layout, x_num_col_dims", "[ops][mul]") {
  // X [2, 2] . W[3, 2]^T
  OpCase c{"mul", {{"X", t({2, 2}, {1, 2, 3, 4})}, {"Y", t({3, 2}, {1, 0, 0, 1, 1, 1})}}, {"Out"}};
  expect_close(run_forward(c)["Out"].to_floats(), {1, 2, 3, 3, 4, 7}, kExact, "mul");
  // X [2, 2, 3] with x_num_col_dims 2: rows are the first two dims.
  const Tensor x = uniform_tensor({2, 2, 3}, 4), w = uniform_tensor({5, 3}, 6);
  OpCase c3{"mul", {{"X", x}, {"Y", w}}, {"Out"}, {{"x_num_col_dims", int64_t{2}}}};
  auto o = run_forward(c3)["Out"];
  CHECK(o.shape() == Shape{2, 2, 5});
  expect_close(o.to_floats(), ref_matmul(x.to_floats(), w.to_floats(), 1, true, 4, 3, 5, false, true, 1.0), kF32,
               "mul 3-D");
  auto o16 = run_forward(c3, DType::f16)["Out"];
  expect_close(o16.to_floats(),
               ref_matmul(rounded(x, DType::f16), rounded(w, DType::f16), 1, true, 4, 3, 5, false, true, 1.0), kF16Out,
               "mul f16");
}

TEST_CASE("cast: rounding to f16/bf16, widening, integers", "[ops][cast]") {
  const Tensor x = t({4}, {1.f / 3.f, 70000.f, 1e-8f, -2.5f});
  OpCase c{"cast", {{"X", x}}, {"Out"}, {{"out_dtype", std::string("f16")}}};
  auto h = run_forward(c)["Out"];
  CHECK(h.dtype() == DType::f16);
  CHECK(h.item_float(0) == round_to_half(1.f / 3.f));
  CHECK(std::isinf(h.item_float(1)));  // overflow to inf, as on a GPU
  CHECK(h.item_float(2) == 0.f);       // below half the smallest subnormal
  CHECK(h.item_float(3) == -2.5f);
  c.attrs = {{"out_dtype", std::string("bf16")}};
  CHECK(run_forward(c)["Out"].item_float(0) == bf16_bits_to_float(float_to_bf16_bits(1.f / 3.f)));
  // f16 -> f32 widening is exact.
  OpCase w{"cast", {{"X", x}}, {"Out"}, {{"out_dtype", std::string("f32")}}};
  auto f = run_forward(w, DType::f16)["Out"];
  CHECK(f.dtype() == DType::f32);
  CHECK(f.item_float(0) == round_to_half(1.f / 3.f));
  OpCase ints{"cast", {{"X", i64_tensor({3}, {-7, 0, 123456})}}, {"Out"}, {{"out_dtype", std::string("i32")}}};
  auto i = run_forward(ints)["Out"];
  CHECK(i.dtype() == DType::i32);
  CHECK(i.data<int32_t>()[0] == -7);
  CHECK(i.data<int32_t>()[2] == 123456);
}

TEST_CASE("scale: bias after and before scale", "[ops][scale]") {
  OpCase c{"scale", {{"X", t({3}, {1, -2, 0.5f})}}, {"Out"}, {{"scale", 2.0}, {"bias", 1.0}}};
  expect_close(run_forward(c)["Out"].to_floats(), {3, -3, 2}, kExact, "2x + 1");
  c.attrs["bias_after_scale"] = false;
  expect_close(run_forward(c)["Out"].to_floats(), {4, -2, 3}, kExact, "2(x + 1)");
  expect_close(run_forward(c, DType::f16)["Out"].to_floats(), {4, -2, 3}, kExact, "2(x + 1) in f16");
}

TEST_CASE("sum: several inputs, FP32 accumulation", "[ops][sum]") {
  OpCase c{"sum", {{"X", t({2}, {1, 2})}, {"X", t({2}, {10, 20})}, {"X", t({2}, {100, 200})}}, {"Out"}};
  expect_close(run_forward(c)["Out"].to_floats(), {111, 222}, kExact, "sum");
  // f16: 2048 + 1 + 1 is 2050 when accumulated in FP32 (2049 is not a half; 2050 is).
  OpCase h{"sum", {{"X", t({1}, {2048})}, {"X", t({1}, {1})}, {"X", t({1}, {1})}}, {"Out"}};
  CHECK(run_forward(h, DType::f16)["Out"].item_float(0) == 2050.f);
}

TEST_CASE("activations: relu, gelu, tanh against double references", "[ops][activation]") {
  const Tensor x = uniform_tensor({3, 7}, 8, -3.f, 3.f);
  const std::vector<float> xv = x.to_floats();
  struct Act {
    const char* type;
    double (*f)(double);
  };
  const Act acts[] = {
      {"relu", [](double v) { return v > 0 ? v : 0.0; }},
      {"gelu", [](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); }},
      {"tanh", [](double v) { return std::tanh(v); }},
  };
  for (const Act& a : acts) {
    INFO(a.type);
    OpCase c{a.type, {{"X", x}}, {"Out"}};
    std::vector<double> ref(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) ref[i] = a.f(xv[i]);
    expect_close(run_forward(c)["Out"].to_floats(), ref, kF32, "f32");
    const std::vector<float> xh = rounded(x, DType::f16);
    for (size_t i = 0; i < xv.size(); ++i) ref[i] = a.f(xh[i]);
    expect_close(run_forward(c, DType::f16)["Out"].to_floats(), ref, kF16Out, "f16");
  }
}

TEST_CASE("relu lets a NaN through, forward and backward, as PyTorch does", "[ops][activation]") {
  // A NaN activation must reach the loss (and the overflow check): zeroing it
  // would train on a broken forward without a sign. Signed zeros and the
  // infinities keep max(x, 0)'s usual values. Every value is exact in each dtype.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const std::vector<float> x = {nan, -nan, inf, -inf, 0.f, -0.f, 1.5f, -1.5f};
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    INFO(dtype_name(dt));
    const auto fwd = run_ops_on({make_op("relu", {{"X", {"x"}}}, {{"Out", {"y"}}})}, {{"x", floats({8}, x, dt)}},
                                cpu_device(), ExecEnv{}, {"y"});
    CHECK(fwd.at("y").dtype() == dt);
    const std::vector<float> y = fwd.at("y").to_floats();
    CHECK(std::isnan(y[0]));
    CHECK(std::isnan(y[1]));
    CHECK(std::vector<float>(y.begin() + 2, y.end()) == std::vector<float>{inf, 0, 0, 0, 1.5f, 0});
    CHECK_FALSE(std::signbit(y[5]));  // relu(-0) is +0
    // relu_grad reads the output: dy passes where y > 0, and where y is NaN.
    const auto bwd = run_ops_on({make_op("relu_grad", {{"Out", {"y"}}, {"Out@GRAD", {"dy"}}}, {{"X@GRAD", {"dx"}}})},
                                {{"y", fwd.at("y")}, {"dy", floats({8}, {1, 2, 3, 4, 5, 6, 7, 8}, dt)}}, cpu_device(),
                                ExecEnv{}, {"dx"});
    CHECK(bwd.at("dx").to_floats() == std::vector<float>{1, 2, 3, 0, 0, 0, 7, 0});
  }
}

TEST_CASE("fill_constant and fill_like_scalar", "[ops][fill]") {
  OpCase c{"fill_constant", {}, {"Out"},
           {{"shape", std::vector<int64_t>{2, 3}}, {"value", 0.1}, {"dtype", std::string("f16")}}};
  auto o = run_forward(c)["Out"];
  CHECK(o.dtype() == DType::f16);
  CHECK(o.shape() == Shape{2, 3});
  for (float v : o.to_floats()) CHECK(v == round_to_half(0.1f));
  OpCase s{"fill_like_scalar", {{"X", t({1}, {32768})}}, {"Out"}, {{"shape", std::vector<int64_t>{1}}}};
  CHECK(run_forward(s)["Out"].item_float(0) == 32768.f);
  CHECK(run_forward(s, DType::f16)["Out"].dtype() == DType::f16);
}
