// [cuda] The CUDA kernels of the Transformer's ops against their CPU twins:
// lookup_table, layer_norm, transpose2, split, dropout (and their gradients)
// and softmax with causal=true. Each op runs as a one-op Program through the
// Executor on the CPU and on cuda:0 with the same random inputs (copied with
// Tensor::to), in FP32, FP16 and BF16 (and integer dtypes for the copies),
// with the model's shapes: [B=2, T=16, D=64] activations, [2, 16, 4, 16]
// heads, a vocabulary of 300 with duplicate ids, causal scores [2, 4, 16, 16]
// and a T < S case. Last, softmax and softmax_with_cross_entropy reading
// FP16/BF16 with out_dtype "f32" (amp::fold_widening_casts) against the same
// kernels on the input cast to FP32, bit for bit, on the GPU.
//
// How close the two must be follows from how each kernel computes (the reason
// is stated at each comparison):
//  - identical: copies (lookup_table, transpose2, split), the same rounded
//    operations in the same order (dropout: one multiply by the same float;
//    lookup_table_grad: FP32 adds in position order), and dropout's mask,
//    which is the same hash of (key, index) on both devices.
//  - row reductions (layer_norm statistics, causal softmax sums) add in
//    another order than the CPU's loop, and layer_norm sums in FP32 where the
//    CPU sums in double. Both twins are then compared with one reference
//    computed here in double from the same (already rounded) inputs, each
//    within the error bound of its own way of adding: terms·u·sum|terms| for
//    an FP32 sum whose longest chain adds `terms` values (u = 2^-24), plus the
//    few roundings of the element steps, plus half an ulp of the storage type
//    on store.
// The runner and the comparisons: tests/unit/cuda_compare.h.
// MIX_CUDA_OPS_VERBOSE=1 prints how close each comparison came to its bound.
// Without a GPU (or in a build without CUDA) the test exits 77, which CTest
// reports as skipped, never as passed.
#include <catch2/catch.hpp>

#include "tests/unit/require_gpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/core/random.h"
#include "runtime/core/tensor.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"
#include "tests/unit/add_layer_norm_check.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/grad_sum_check.h"
#include "tests/unit/gradcheck.h"
#include "tests/unit/softmax_reference.h"
#include "tests/unit/widening_check.h"

#ifdef MIX_HAVE_CUDA
#include "runtime/cuda/context.h"
#include "runtime/ops/cuda/strided_copy.h"
#endif
#include "runtime/kernels/transpose_index.h"
#include "runtime/ops/transpose2_shapes.h"

using namespace mix;
using namespace mix::testing;

namespace {

// ---- tensors ----------------------------------------------------------------------------

// Random bytes as a tensor of any dtype (integers for the copy ops; every bit pattern is fine there).
Tensor random_bits(const Shape& s, DType t, uint64_t seed) {
  Tensor x = Tensor::empty(s, t);
  mix::Rng rng = mix::Rng::for_stream(seed, 3);
  auto* p = static_cast<unsigned char*>(x.raw());
  for (size_t i = 0; i < x.bytes(); ++i) p[i] = static_cast<unsigned char>(rng.next_u64() >> 56);
  return x;
}

// A tensor of `dtype` for the copy ops: random values for float types, random bits otherwise.
Tensor copy_input(const Shape& s, DType t, uint64_t seed) {
  return mix::is_floating(t) ? random_tensor(s, t, seed) : random_bits(s, t, seed);
}

Tensor ids_tensor(const Shape& s, const std::vector<int64_t>& v, DType t) {
  if (t == DType::i64) return mix::testing::i64_tensor(s, v);
  Tensor x = Tensor::empty(s, DType::i32);
  REQUIRE(x.numel() == static_cast<int64_t>(v.size()));
  for (size_t i = 0; i < v.size(); ++i) x.data<int32_t>()[i] = static_cast<int32_t>(v[i]);
  return x;
}

}  // namespace

// ---- lookup_table ---------------------------------------------------------------------------

TEST_CASE("lookup_table and lookup_table_grad are identical to the CPU", "[cuda][lookup_table]") {
  require_gpu();
  const int64_t vocab = 300;
  const Shape ids_shape{2, 16};
  // Duplicates on purpose: half the ids come from 0..9, the rest from the whole
  // vocabulary, and the first and last rows and the padding row 7 appear.
  mix::Rng rng(201);
  std::vector<int64_t> ids(32);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int64_t>(i % 2 == 0 ? rng.below(10) : rng.below(static_cast<uint64_t>(vocab)));
  ids[1] = 0;
  ids[3] = vocab - 1;
  ids[5] = ids[9] = ids[30] = 7;
  // D = 64: 16-byte copies in every dtype; 6: 8 bytes (f16) or 8 (f32); 3: 2 or 4 bytes.
  for (DType dt : kFloatTypes)
    for (int64_t d : {64, 6, 3})
      for (int64_t padding : {int64_t{-1}, int64_t{7}})
        for (DType id_type : {DType::i64, DType::i32}) {
          const std::string what = "lookup_table " + dname(dt) + " D " + std::to_string(d) + " padding " +
                                   std::to_string(padding) + " ids " + dname(id_type);
          const Tensor w = random_tensor({vocab, d}, dt, 202 + static_cast<uint64_t>(d));
          const Tensor id = ids_tensor(ids_shape, ids, id_type);
          const std::map<std::string, Attr> attrs{{"padding_idx", padding}};
          const OneOp fwd{make_op("lookup_table", {{"W", {"w"}}, {"Ids", {"ids"}}}, {{"Out", {"out"}}}, attrs),
                          {{"w", w}, {"ids", id}}};
          const Both f = run_both(fwd, {"out"});
          // A copy of W's rows (zeros for the padding row): identical.
          expect_identical(f.gpu.at("out"), f.cpu.at("out"), what);

          const Tensor dout = random_tensor({2, 16, d}, dt, 203);
          const OneOp bwd{make_op("lookup_table_grad", {{"W", {"w"}}, {"Ids", {"ids"}}, {"Out@GRAD", {"dout"}}},
                                  {{"W@GRAD", {"dw"}}}, attrs),
                          {{"w", w}, {"ids", id}, {"dout", dout}}};
          const Both b = run_both(bwd, {"dw"});
          // Each id's rows of Out@GRAD are added in FP32 in position order on
          // both devices (the GPU sorts the ids stably first), from 0, and
          // rounded once to W's dtype: the same operations, so identical.
          expect_identical(b.gpu.at("dw"), b.cpu.at("dw"), what + " grad");
        }
}

TEST_CASE("lookup_table on CUDA: an out-of-range id gives a NaN row and no gradient",
          "[cuda][gpu_only][lookup_table][bad_ids]") {
  require_gpu();
  // The CPU kernel throws naming the id; the GPU cannot without a host round
  // trip, so the row is NaN and the id sends no gradient (see lookup_table.cu).
  const Tensor w = random_tensor({5, 4}, DType::f32, 211);
  const Tensor ids = mix::testing::i64_tensor({4}, {1, 5, -1, 2});
  const OneOp c{make_op("lookup_table", {{"W", {"w"}}, {"Ids", {"ids"}}}, {{"Out", {"out"}}}),
                {{"w", w}, {"ids", ids}}};
  CHECK_THROWS_WITH(run_on(c, cpu_device(), {"out"}), Catch::Matchers::Contains("id 5 at position [1]"));
  const std::vector<float> out = run_on(c, kGpu, {"out"}).at("out").to_floats();
  const std::vector<float> wv = w.to_floats();
  for (int64_t j = 0; j < 4; ++j) {
    CHECK(out[j] == wv[4 + j]);
    CHECK(std::isnan(out[4 + j]));
    CHECK(std::isnan(out[8 + j]));
    CHECK(out[12 + j] == wv[8 + j]);
  }
  const Tensor dout = uniform_tensor({4, 4}, 212);
  const OneOp g{
      make_op("lookup_table_grad", {{"W", {"w"}}, {"Ids", {"ids"}}, {"Out@GRAD", {"dout"}}}, {{"W@GRAD", {"dw"}}}),
      {{"w", w}, {"ids", ids}, {"dout", dout}}};
  const std::vector<float> dw = run_on(g, kGpu, {"dw"}).at("dw").to_floats();
  const std::vector<float> dv = dout.to_floats();
  for (int64_t j = 0; j < 4; ++j) {
    CHECK(dw[j] == 0.f);
    CHECK(dw[4 + j] == dv[j]);       // id 1 at position 0
    CHECK(dw[8 + j] == dv[12 + j]);  // id 2 at position 3
    CHECK(dw[12 + j] == 0.f);
    CHECK(dw[16 + j] == 0.f);
  }
}

// ---- layer_norm ------------------------------------------------------------------------------

namespace {

// The longest chain of FP32 adds of a row sum in layer_norm.cu: all cols
// summed by the row's warp or block (gpu_row_terms).
int64_t ln_gpu_terms(int64_t cols) { return gpu_row_terms(cols, cols); }
// The CPU sums in double: its statistics are the exact ones rounded once to
// float (the double error, n·2^-53 relative, is below one float rounding).
constexpr int64_t kLnCpuTerms = 1;

struct LnRef {
  std::vector<double> mean, var, abs_mean;  // per row; abs_mean = mean |x|
};
LnRef ln_stats(const std::vector<float>& x, int64_t rows, int64_t cols) {
  LnRef r;
  for (int64_t i = 0; i < rows; ++i) {
    double s = 0, a = 0;
    for (int64_t j = 0; j < cols; ++j) {
      s += x[i * cols + j];
      a += std::fabs(x[i * cols + j]);
    }
    const double m = s / static_cast<double>(cols);
    double ss = 0;
    for (int64_t j = 0; j < cols; ++j) ss += (x[i * cols + j] - m) * (x[i * cols + j] - m);
    r.mean.push_back(m);
    r.var.push_back(ss / static_cast<double>(cols));
    r.abs_mean.push_back(a / static_cast<double>(cols));
  }
  return r;
}

}  // namespace

TEST_CASE("layer_norm and layer_norm_grad match the CPU and a double reference", "[cuda][layer_norm]") {
  require_gpu();
  struct Case {
    Shape x;
    int64_t begin_norm_axis;
    bool affine;  // Scale and Bias present
  };
  const Case cases[] = {
      {{2, 16, 64}, 2, true},    // the model's: one warp per row of 64
      {{2, 16, 64}, 1, true},    // rows of 1024: still a warp, 32 values per lane
      {{3, 5, 1500}, -1, true},  // a block per row
      {{4, 2000}, 1, false},     // a block per row, no Scale or Bias
  };
  const float eps = 1e-5f;
  for (DType dt : kFloatTypes)
    for (const Case& k : cases) {
      const int64_t ndim = static_cast<int64_t>(k.x.size());
      const auto axis = static_cast<size_t>(k.begin_norm_axis < 0 ? k.begin_norm_axis + ndim : k.begin_norm_axis);
      int64_t rows = 1, cols = 1;
      for (size_t i = 0; i < k.x.size(); ++i) (i < axis ? rows : cols) *= k.x[i];
      const std::string what = dname(dt) + " X" + mix::shape_str(k.x) + " axis " + std::to_string(k.begin_norm_axis);
      // Mean 1, spread 2: the variance pass must subtract the mean first.
      const Tensor x = random_tensor(k.x, dt, 301, -1.f, 3.f);
      const Tensor scale = uniform_tensor({cols}, 302, 0.5f, 1.5f);
      const Tensor bias = uniform_tensor({cols}, 303, -0.5f, 0.5f);
      std::map<std::string, std::vector<std::string>> ins{{"X", {"x"}}};
      std::vector<std::pair<std::string, Tensor>> feeds{{"x", x}};
      if (k.affine) {
        ins["Scale"] = {"scale"};
        ins["Bias"] = {"bias"};
        feeds.push_back({"scale", scale});
        feeds.push_back({"bias", bias});
      }
      const std::map<std::string, Attr> attrs{{"begin_norm_axis", k.begin_norm_axis}, {"epsilon", double{eps}}};
      const OneOp fwd{make_op("layer_norm", ins, {{"Y", {"y"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}}, attrs),
                      feeds};
      const Both f = run_both(fwd, {"y", "mean", "var"});

      const std::vector<float> xv = x.to_floats(), sv = scale.to_floats(), bv = bias.to_floats();
      const LnRef st = ln_stats(xv, rows, cols);
      auto s_at = [&](int64_t j) { return k.affine ? static_cast<double>(sv[j]) : 1.0; };
      auto b_at = [&](int64_t j) { return k.affine ? static_cast<double>(bv[j]) : 0.0; };
      std::vector<double> yref(xv.size());
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t e = i * cols + j;
          yref[e] = (xv[e] - st.mean[i]) / std::sqrt(st.var[i] + eps) * s_at(j) + b_at(j);
        }
      // Mean: a sum of `terms` chained FP32 adds errs by terms·u·sum|x| (over n:
      // terms·u·mean|x|), the division and the store by u·|mean| each.
      const auto mean_err = [&](int64_t terms, int64_t i) {
        return static_cast<double>(terms) * kU * st.abs_mean[i] + 2 * kU * std::fabs(st.mean[i]);
      };
      // Variance: each (x - mean)^2 is within 3u of itself (subtract, square),
      // their sum within terms·u of sum (x - mean)^2 (all positive terms), the
      // division and the store u each; a mean off by delta adds delta^2 (the
      // deviations sum to 0, so the cross term vanishes).
      const auto var_err = [&](int64_t terms, int64_t i) {
        const double dm = mean_err(terms, i);
        return static_cast<double>(terms + 5) * kU * st.var[i] + dm * dm;
      };
      // Y = (x - mean)·inv_std·scale + bias: the mean's error moves it by
      // |scale|·inv_std·delta_mean, the variance's relative error by half that
      // relative error of |xhat·scale|; the subtract, 1/sqrt (2 roundings),
      // the products and the add (an FMA on the GPU) a few u of |xhat·scale| +
      // |bias|; then half an ulp of T on store.
      const auto y_bound = [&](int64_t terms) {
        return [&, terms](int64_t e) {
          const int64_t i = e / cols, j = e % cols;
          const double inv_std = 1 / std::sqrt(st.var[i] + eps);
          const double xs = std::fabs((xv[e] - st.mean[i]) * inv_std * s_at(j));
          return std::fabs(s_at(j)) * inv_std * mean_err(terms, i) +
                 xs * (0.5 * var_err(terms, i) * inv_std * inv_std) + 8 * kU * (xs + std::fabs(b_at(j))) +
                 store_rel(dt) * std::fabs(yref[e]) + store_abs(dt);
        };
      };
      const int64_t gt = ln_gpu_terms(cols);
      expect_within(f.gpu.at("y"), yref, y_bound(gt), "layer_norm Y (GPU) " + what);
      expect_within(f.cpu.at("y"), yref, y_bound(kLnCpuTerms), "layer_norm Y (CPU) " + what);
      expect_within(
          f.gpu.at("mean"), st.mean, [&](int64_t i) { return mean_err(gt, i); }, "layer_norm Mean (GPU) " + what);
      expect_within(
          f.cpu.at("mean"), st.mean, [&](int64_t i) { return mean_err(kLnCpuTerms, i); },
          "layer_norm Mean (CPU) " + what);
      expect_within(
          f.gpu.at("var"), st.var, [&](int64_t i) { return var_err(gt, i); }, "layer_norm Variance (GPU) " + what);
      expect_within(
          f.cpu.at("var"), st.var, [&](int64_t i) { return var_err(kLnCpuTerms, i); },
          "layer_norm Variance (CPU) " + what);

      // The gradient, from the CPU's saved statistics on both devices.
      const Tensor dy = random_tensor(k.x, dt, 304);
      std::map<std::string, std::vector<std::string>> gins{
          {"X", {"x"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}, {"Y@GRAD", {"dy"}}};
      std::vector<std::pair<std::string, Tensor>> gfeeds{
          {"x", x}, {"mean", f.cpu.at("mean")}, {"var", f.cpu.at("var")}, {"dy", dy}};
      std::map<std::string, std::vector<std::string>> gouts{{"X@GRAD", {"dx"}}, {"Bias@GRAD", {"dbias"}}};
      std::vector<std::string> results{"dx", "dbias"};
      if (k.affine) {
        gins["Scale"] = {"scale"};
        gfeeds.push_back({"scale", scale});
        gouts["Scale@GRAD"] = {"dscale"};
        results.push_back("dscale");
      }
      const OneOp bwd{make_op("layer_norm_grad", gins, gouts, attrs), gfeeds};
      const Both b = run_both(bwd, results);

      // Reference from the float statistics both kernels read: inv_std, xhat,
      // g = dy·scale, dx = inv_std·(g - mean(g) - xhat·mean(g·xhat)).
      const std::vector<float> dyv = dy.to_floats(), mf = f.cpu.at("mean").to_floats(),
                               vf = f.cpu.at("var").to_floats();
      std::vector<double> dxref(xv.size()), inv(rows), mg(rows), mgx(rows), amg(rows), amgx(rows);
      std::vector<double> dsref(cols, 0.0), dbref(cols, 0.0), ds_mag(cols, 0.0), db_mag(cols, 0.0);
      std::vector<double> xhat(xv.size());
      for (int64_t i = 0; i < rows; ++i) {
        inv[i] = 1 / std::sqrt(static_cast<double>(vf[i]) + eps);
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t e = i * cols + j;
          xhat[e] = (xv[e] - static_cast<double>(mf[i])) * inv[i];
          const double g = dyv[e] * s_at(j);
          mg[i] += g;
          mgx[i] += g * xhat[e];
          amg[i] += std::fabs(g);
          amgx[i] += std::fabs(g * xhat[e]);
          dsref[j] += dyv[e] * xhat[e];
          ds_mag[j] += std::fabs(dyv[e] * xhat[e]);
          dbref[j] += dyv[e];
          db_mag[j] += std::fabs(dyv[e]);
        }
        for (double* v : {&mg[i], &mgx[i], &amg[i], &amgx[i]}) *v /= static_cast<double>(cols);
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t e = i * cols + j;
          dxref[e] = inv[i] * (dyv[e] * s_at(j) - mg[i] - xhat[e] * mgx[i]);
        }
      }
      // dx: mean(g) and mean(g·xhat) err by terms·u of the means of |g| and
      // |g·xhat| (FP32 sums; the CPU's in double: rounding only), xhat by ~5u
      // (subtract, 1/sqrt, multiply), g by u; the three-term difference (FMAs
      // on the GPU) and the multiply by inv_std a few u of its terms'
      // magnitudes. The result is a difference of such terms, so the bound is
      // relative to them, not to |dx|; then half an ulp of T on store.
      const auto dx_bound = [&](int64_t terms) {
        return [&, terms](int64_t e) {
          const int64_t i = e / cols, j = e % cols;
          const double mag = std::fabs(dyv[e] * s_at(j)) + amg[i] + std::fabs(xhat[e]) * (amgx[i] + std::fabs(mgx[i]));
          return inv[i] * static_cast<double>(terms + 12) * kU * mag + store_rel(dt) * std::fabs(dxref[e]) +
                 store_abs(dt);
        };
      };
      expect_within(b.gpu.at("dx"), dxref, dx_bound(gt), "layer_norm_grad dX (GPU) " + what);
      expect_within(b.cpu.at("dx"), dxref, dx_bound(kLnCpuTerms), "layer_norm_grad dX (CPU) " + what);
      // Bias@GRAD and Scale@GRAD: column sums in double on both devices of the
      // same terms (dy, and dy·xhat with xhat the same float on both): against
      // the reference (xhat in double), 6u of sum|dy·xhat| for xhat's float
      // error, the double sums' rows·2^-53 of the magnitudes (twice: the float
      // rounding of an inexact double sum), and the rounding to float u·|ref|
      // (round to nearest: at most half an ulp, which is at most u·|ref|). Between the devices only the order of the
      // double additions differs: at most one float ulp apart (2^-23·|cpu|), plus the double sums' error where the sum
      // cancels.
      const auto col_bound = [rows](const std::vector<double>& ref, const std::vector<double>& mag, double xhat_rel) {
        return [ref, mag, xhat_rel, rows](int64_t j) {
          return xhat_rel * mag[j] + 2 * static_cast<double>(rows) * 0x1p-53 * mag[j] + kU * std::fabs(ref[j]) +
                 0x1p-149;
        };
      };
      const auto ulp_apart = [rows](const Tensor& cpu, const std::vector<double>& mag) {
        return [c = doubles(cpu), mag, rows](int64_t j) {
          return 0x1p-23 * std::fabs(c[j]) + static_cast<double>(rows) * 0x1p-52 * mag[j] + 0x1p-149;
        };
      };
      for (auto [side, res] : {std::pair{"GPU", &b.gpu}, std::pair{"CPU", &b.cpu}})
        expect_within(res->at("dbias"), dbref, col_bound(dbref, db_mag, 0.0),
                      std::string("layer_norm_grad Bias@GRAD (") + side + ") " + what);
      expect_within(b.gpu.at("dbias"), doubles(b.cpu.at("dbias")), ulp_apart(b.cpu.at("dbias"), db_mag),
                    "layer_norm_grad Bias@GRAD GPU vs CPU " + what);
      if (k.affine) {
        for (auto [side, res] : {std::pair{"GPU", &b.gpu}, std::pair{"CPU", &b.cpu}})
          expect_within(res->at("dscale"), dsref, col_bound(dsref, ds_mag, 6 * kU),
                        std::string("layer_norm_grad Scale@GRAD (") + side + ") " + what);
        expect_within(b.gpu.at("dscale"), doubles(b.cpu.at("dscale")), ulp_apart(b.cpu.at("dscale"), ds_mag),
                      "layer_norm_grad Scale@GRAD GPU vs CPU " + what);
      }
    }
}

// ---- transpose2 ------------------------------------------------------------------------------

TEST_CASE("transpose2 and transpose2_grad are identical to the CPU, any dtype", "[cuda][transpose2]") {
  require_gpu();
  struct Case {
    Shape x;
    std::vector<int64_t> perm;
  };
  const Case cases[] = {
      {{2, 16, 4, 16}, {0, 2, 1, 3}},      // attention's [B, T, H, hd] -> [B, H, T, hd]
      {{2, 4, 16, 16}, {0, 2, 1, 3}},      // and back
      {{33, 65}, {1, 0}},                  // the last dim moves: strided reads
      {{2, 3, 1, 5, 7}, {4, 2, 0, 3, 1}},  // a size-1 dim, five dims
      {{3, 5, 8}, {0, 1, 2}},              // the identity: one run
      {{6, 10, 3}, {1, 0, 2}},             // runs of 3 elements: no wider copy unit
  };
  const DType types[] = {DType::f32, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8};
  for (DType dt : types)
    for (const Case& k : cases) {
      const std::string what = dname(dt) + " X" + mix::shape_str(k.x) + " axis " + mix::shape_str(k.perm);
      const std::map<std::string, Attr> attrs{{"axis", k.perm}};
      const Tensor x = copy_input(k.x, dt, 401);
      const OneOp fwd{make_op("transpose2", {{"X", {"x"}}}, {{"Out", {"out"}}, {"XShape", {"xshape"}}}, attrs),
                      {{"x", x}}};
      const Both f = run_both(fwd, {"out", "xshape"});
      // A permuted copy of the bytes: identical.
      expect_identical(f.gpu.at("out"), f.cpu.at("out"), "transpose2 " + what);
      CHECK(f.gpu.at("xshape").shape() == f.cpu.at("xshape").shape());

      const Tensor dout = copy_input(f.cpu.at("out").shape(), dt, 402);
      const OneOp bwd{make_op("transpose2_grad", {{"Out@GRAD", {"dout"}}}, {{"X@GRAD", {"dx"}}}, attrs),
                      {{"dout", dout}}};
      const Both b = run_both(bwd, {"dx"});
      expect_identical(b.gpu.at("dx"), b.cpu.at("dx"), "transpose2_grad " + what);
      CHECK(b.gpu.at("dx").shape() == k.x);
    }
}

// The copies under transpose2's, with a plan handed in: gathers and
// scatters of permutations and of strided views (conv2d's sampled pixels
// under --cublas-1x1-conv), against their CPU twins. Each starts from a
// destination filled with other bytes, so a scatter that writes past its
// view, or a gather that misses an element, differs.
TEST_CASE("gather_into and scatter_into are identical to their CPU twins", "[cuda][gpu_only][transpose2]") {
  require_gpu();
#ifdef MIX_HAVE_CUDA
  struct Case {
    const char* name;
    std::vector<int64_t> x_dims, dims, strides;  // X's extent; the plan: Out's dims and X's strides
  };
  const Case cases[] = {
      {"[B, T, H, hd] -> [B, H, T, hd]", {2, 16, 4, 16}, {2, 4, 16, 16}, {1024, 16, 64, 1}},
      {"the last dim moves", {33, 65}, {65, 33}, {1, 65}},
      // A stride-2 1x1 convolution's pixels: runs of 8 channels (16-byte units
      // for 16-bit types), of 5 (no wider unit), and of 8 whose outer strides
      // are not whole 16-byte units (12 channels a pixel: 8-byte units at most).
      {"sampled pixels, 8 channels", {2, 10, 10, 8}, {2, 5, 5, 8}, {800, 160, 16, 1}},
      {"sampled pixels, 5 channels, odd extents", {2, 9, 7, 5}, {2, 5, 4, 5}, {315, 70, 10, 1}},
      {"the first 8 of each pixel's 12 channels", {3, 4, 12}, {3, 4, 8}, {48, 12, 1}},
  };
  const DType types[] = {DType::f32, DType::f16, DType::bf16, DType::i64, DType::u8};
  for (DType dt : types)
    for (const Case& k : cases) {
      const std::string what = dname(dt) + " " + k.name;
      const size_t es = dtype_size(dt);
      const fn::TransposePlan plan =
          fn::make_view_plan(k.dims.data(), k.strides.data(), static_cast<int>(k.dims.size()));
      const Tensor x = copy_input(k.x_dims, dt, 403);
      const Tensor gx = x.to(kGpu);
      const Shape dense_shape(k.dims.begin(), k.dims.end());
      const int64_t numel = shape_numel(dense_shape);
      const cudaStream_t stream = cuda::use_device(kGpu.index).compute.get();

      Tensor want = copy_input(dense_shape, dt, 404);
      Tensor got = want.to(kGpu);
      transpose_rules::gather_cpu(x.raw(), want.raw(), plan, numel, es);
      cuda::gather_into(gx.raw(), got.raw(), plan, numel, es, stream, "test");
      expect_identical(got.to(cpu_device()), want, "gather " + what);

      const Tensor dense = copy_input(dense_shape, dt, 405);
      Tensor want_back = copy_input(k.x_dims, dt, 406);
      Tensor got_back = want_back.to(kGpu);
      transpose_rules::scatter_cpu(dense.raw(), want_back.raw(), plan, numel, es);
      cuda::scatter_into(dense.to(kGpu).raw(), got_back.raw(), plan, numel, es, stream, "test");
      expect_identical(got_back.to(cpu_device()), want_back, "scatter " + what);
    }
#endif
}

// ---- split ---------------------------------------------------------------------------------

TEST_CASE("split and split_grad are identical to the CPU, any dtype", "[cuda][split]") {
  require_gpu();
  // Once more with the row-by-row copies and memsets meant for rows over 2 GiB.
  const bool wide = GENERATE(false, true);
  const LargeTensorPaths large(wide);
  struct Case {
    Shape x;
    std::map<std::string, Attr> attrs;
    size_t parts;
  };
  const Case cases[] = {
      {{2, 16, 192}, {{"axis", int64_t{-1}}, {"num", int64_t{3}}}, 3},  // the fused q, k, v
      {{3, 20, 6}, {{"axis", int64_t{1}}, {"sections", std::vector<int64_t>{5, -1, 7}}}, 3},
      {{4, 6}, {{"axis", int64_t{0}}, {"num", int64_t{2}}}, 2},  // outer 1: each part is contiguous
  };
  const DType types[] = {DType::f32, DType::f16, DType::bf16, DType::i64, DType::i32};
  for (DType dt : types)
    for (const Case& k : cases) {
      const std::string what = dname(dt) + " X" + mix::shape_str(k.x) + (wide ? " (row by row)" : "");
      std::vector<std::string> outs, douts;
      for (size_t i = 0; i < k.parts; ++i) {
        outs.push_back("p" + std::to_string(i));
        douts.push_back("d" + std::to_string(i));
      }
      const Tensor x = copy_input(k.x, dt, 501);
      const OneOp fwd{make_op("split", {{"X", {"x"}}}, {{"Out", outs}}, k.attrs), {{"x", x}}};
      const Both f = run_both(fwd, outs);
      // Byte copies: identical.
      for (const std::string& o : outs) expect_identical(f.gpu.at(o), f.cpu.at(o), "split " + what + " " + o);

      // Every part with a gradient, then the middle one without (zeros, sized from X).
      for (bool missing : {false, true}) {
        std::vector<std::pair<std::string, Tensor>> feeds;
        std::vector<std::string> names = douts;
        for (size_t i = 0; i < k.parts; ++i)
          feeds.push_back({douts[i], copy_input(f.cpu.at(outs[i]).shape(), dt, 502 + i)});
        std::map<std::string, std::vector<std::string>> ins;
        if (missing) {
          names[1] = "";
          feeds.erase(feeds.begin() + 1);
          feeds.push_back({"x", x});
          ins["X"] = {"x"};
        }
        ins["Out@GRAD"] = names;
        const OneOp bwd{make_op("split_grad", ins, {{"X@GRAD", {"dx"}}}, k.attrs), feeds};
        const Both b = run_both(bwd, {"dx"});
        expect_identical(b.gpu.at("dx"), b.cpu.at("dx"), "split_grad " + what + (missing ? " (part 1 missing)" : ""));
        CHECK(b.gpu.at("dx").shape() == k.x);
      }
    }
}

// ---- dropout ---------------------------------------------------------------------------------

TEST_CASE("dropout's mask and outputs are identical to the CPU's for the same key", "[cuda][dropout]") {
  require_gpu();
  for (DType dt : kFloatTypes)
    for (const Shape& s : {Shape{2, 16, 64}, Shape{1000, 37}})
      for (double p : {0.1, 0.5}) {
        const std::string what = dname(dt) + " " + mix::shape_str(s) + " p " + std::to_string(p);
        const Tensor x = random_tensor(s, dt, 601);
        const std::map<std::string, Attr> attrs{{"dropout_prob", p}, {"seed", int64_t{5}}};
        // Step 3 on rank 1: both fields enter the key (dropout_rules::mask_key).
        OneOp fwd{make_op("dropout", {{"X", {"x"}}}, {{"Out", {"out"}}, {"Mask", {"mask"}}}, attrs), {{"x", x}}, 3, 1};
        const Both f = run_both(fwd, {"out", "mask"});
        // The mask is the same hash of (key, index) on both devices: bit for bit.
        expect_identical(f.gpu.at("mask"), f.cpu.at("mask"), "dropout Mask " + what);
        // With the step in device memory (ExecEnv::device_step, as a recorded
        // step has it) the key is made on the GPU: the same key, the same bits.
        Tensor step_now = Tensor::empty({1}, DType::i64);
        step_now.data<int64_t>()[0] = 3;
        step_now = step_now.to(kGpu);
        ExecEnv env;
        env.step = 99;  // ignored: the device's step decides
        env.rank = 1;
        env.device_step = step_now.data<int64_t>();
        const auto on_device = run_ops_on({fwd.op}, fwd.feeds, kGpu, env, {"out", "mask"});
        expect_identical(on_device.at("mask"), f.cpu.at("mask"), "dropout Mask, step on the device, " + what);
        expect_identical(on_device.at("out"), f.cpu.at("out"), "dropout Out, step on the device, " + what);
        // Out = x * keep * (1 / (1 - p)): one multiply by the same float, one rounding: identical.
        expect_identical(f.gpu.at("out"), f.cpu.at("out"), "dropout Out " + what);
        // And the mask is a dropout mask at all: about 1 - p kept (n >= 2048: 5 sigma < 0.06).
        int64_t kept = 0;
        const Tensor& m = f.gpu.at("mask");
        for (int64_t i = 0; i < m.numel(); ++i) kept += m.data<uint8_t>()[i];
        CHECK(static_cast<double>(kept) / static_cast<double>(m.numel()) == Approx(1 - p).margin(0.06));

        const Tensor dout = random_tensor(s, dt, 602);
        OneOp bwd{make_op("dropout_grad", {{"Mask", {"mask"}}, {"Out@GRAD", {"dout"}}}, {{"X@GRAD", {"dx"}}}, attrs),
                  {{"mask", f.cpu.at("mask")}, {"dout", dout}},
                  3,
                  1};
        const Both b = run_both(bwd, {"dx"});
        expect_identical(b.gpu.at("dx"), b.cpu.at("dx"), "dropout_grad " + what);

        // Evaluation (ExecEnv::training false) and is_test: Out = X, Mask all ones, dX = dOut.
        for (bool is_test : {false, true}) {
          std::map<std::string, Attr> a = attrs;
          a["is_test"] = is_test;
          OneOp id{make_op("dropout", {{"X", {"x"}}}, {{"Out", {"out"}}, {"Mask", {"mask"}}}, a), {{"x", x}}, 3, 1};
          id.training = is_test;  // one of the two switches off at a time
          const Both r = run_both(id, {"out", "mask"});
          const std::string w = what + (is_test ? " is_test" : " eval");
          expect_identical(r.gpu.at("out"), x, "dropout identity Out " + w);
          expect_identical(r.gpu.at("mask"), r.cpu.at("mask"), "dropout identity Mask " + w);
          OneOp idg{make_op("dropout_grad", {{"Mask", {"mask"}}, {"Out@GRAD", {"dout"}}}, {{"X@GRAD", {"dx"}}}, a),
                    {{"mask", r.cpu.at("mask")}, {"dout", dout}},
                    3,
                    1};
          idg.training = is_test;
          expect_identical(run_on(idg, kGpu, {"dx"}).at("dx"), dout, "dropout_grad identity " + w);
        }
      }
}

// ---- softmax with causal=true ------------------------------------------------------------------

TEST_CASE("causal softmax and its gradient match the CPU and a double reference; masked keys are exact zeros",
          "[cuda][softmax][causal]") {
  require_gpu();
  const double inf = std::numeric_limits<double>::infinity();
  // [B, H, T, S]: T == S (training), T < S (queries after a prefix of keys),
  // rows longer than a warp (S = 300 > 32 lanes), and rows a block each
  // (S = 1100 > 1024, softmax.cu's line between warps and blocks).
  for (DType dt : kFloatTypes)
    for (const Shape& s : {Shape{2, 4, 16, 16}, Shape{2, 4, 8, 16}, Shape{2, 5, 300}, Shape{1, 3, 1100}}) {
      const int64_t cols = s.back(), t = s[s.size() - 2], rows = mix::shape_numel(s) / cols;
      const std::string what = dname(dt) + " " + mix::shape_str(s);
      const Tensor x = random_tensor(s, dt, 701, -5.f, 5.f);
      const std::vector<float> xv = x.to_floats();
      const std::map<std::string, Attr> attrs{{"axis", int64_t{-1}}, {"causal", true}};
      const OneOp c{make_op("softmax", {{"X", {"x"}}}, {{"Out", {"y"}}}, attrs), {{"x", x}}};
      const Both r = run_both(c, {"y"});

      // Reference over each row's visible prefix (query i sees keys j <= i + S - T),
      // bounds as softmax's in test_cuda_ops.cc (softmax_reference.h): the
      // sum's chained adds are the prefix's on the CPU, gpu_row_terms (a warp's
      // or, past 1024 keys, a block's strided sums and tree) on the GPU.
      // Masked entries are exactly 0 (the reference's 0 passes with
      // store_abs, checked exactly below).
      const SoftmaxRef ref = softmax_ref(xv, rows, cols, [&](int64_t i) { return i % t + (cols - t) + 1; });
      const std::vector<int64_t> masked = ref.masked_entries();
      const SumTerms gpu_terms = [cols](int64_t n) { return gpu_row_terms(n, cols); };
      expect_within(r.gpu.at("y"), ref.y, softmax_bound(ref, dt, gpu_terms), "causal softmax (GPU) " + what);
      expect_within(r.cpu.at("y"), ref.y, softmax_bound(ref, dt, cpu_sum_terms), "causal softmax (CPU) " + what);
      expect_exact_zeros(r.gpu.at("y"), masked, "causal softmax masked keys (GPU) " + what);
      expect_exact_zeros(r.cpu.at("y"), masked, "causal softmax masked keys (CPU) " + what);

      // The gradient from the CPU's Out, with inf and NaN in dOut on masked keys:
      // they are never read (dX there is exactly 0, and no NaN reaches the prefix).
      const Tensor y = r.cpu.at("y");
      std::vector<float> dyv = random_tensor(s, dt, 702).to_floats();
      for (size_t q = 0; q < masked.size(); ++q)
        dyv[masked[q]] = q % 3 == 0 ? std::nanf("") : q % 3 == 1 ? static_cast<float>(inf) : 1e4f;
      const Tensor dy = floats(s, dyv, dt);
      dyv = dy.to_floats();
      const OneOp g{make_op("softmax_grad", {{"Out", {"y"}}, {"Out@GRAD", {"dy"}}}, {{"X@GRAD", {"dx"}}}, attrs),
                    {{"y", y}, {"dy", dy}}};
      const Both rg = run_both(g, {"dx"});
      const std::vector<float> yv = y.to_floats();
      const SoftmaxGradRef gref = softmax_grad_ref(ref, yv, dyv);
      expect_within(rg.gpu.at("dx"), gref.dx, softmax_grad_bound(ref, gref, yv, dyv, dt, gpu_terms),
                    "causal softmax_grad (GPU) " + what);
      expect_within(rg.cpu.at("dx"), gref.dx, softmax_grad_bound(ref, gref, yv, dyv, dt, cpu_sum_terms),
                    "causal softmax_grad (CPU) " + what);
      expect_exact_zeros(rg.gpu.at("dx"), masked, "causal softmax_grad masked keys (GPU) " + what);
      expect_exact_zeros(rg.cpu.at("dx"), masked, "causal softmax_grad masked keys (CPU) " + what);
    }
}

// ---- out_dtype f32 (amp::fold_widening_casts) ------------------------------------------------

TEST_CASE("softmax and cross-entropy with out_dtype f32 on the GPU: the values of the op on the FP32 cast",
          "[cuda][softmax][cross_entropy][fold]") {
  require_gpu();
  // On one device both sides run the same kernel code, with the same group
  // size per row, on the same widened values, so they must agree bit for bit
  // (tests/unit/widening_check.h). The shapes take both the warp-per-row and
  // the block-per-row paths of softmax and of the cross-entropy gradient
  // (1024 columns and fewer, and more), causal rows, and an ignored label.
  for (DType narrow : {DType::f16, DType::bf16}) {
    for (const Shape& s : {Shape{7, 10}, Shape{33, 257}, Shape{4, 1100}, Shape{2, 3, 64}})
      check_widening_softmax(kGpu, narrow, s, false);
    for (const Shape& s : {Shape{2, 4, 16, 16}, Shape{1, 3, 1100}}) check_widening_softmax(kGpu, narrow, s, true);
    for (const Shape& s : {Shape{64, 10}, Shape{16, 1000}, Shape{5, 3, 300}, Shape{4, 3000}})
      check_widening_cross_entropy(kGpu, narrow, s);
  }
}

TEST_CASE("residual add and layer_norm with narrow operands on the GPU: the values of the ops on the FP32 casts",
          "[cuda][layer_norm][elementwise][fold]") {
  require_gpu();
  // Bit for bit on one device (tests/unit/widening_check.h): the packed and
  // unpacked paths of the mixed add (sizes that are and are not multiples of
  // the pack), and layer_norm's warp-per-row and block-per-row paths.
  for (DType narrow : {DType::f16, DType::bf16}) {
    for (const Shape& s : {Shape{7, 10}, Shape{8, 1024}, Shape{3, 1030}}) check_narrow_residual_add(kGpu, narrow, s);
    for (const Shape& s : {Shape{7, 10}, Shape{33, 768}, Shape{4, 1100}}) check_narrowing_layer_norm(kGpu, narrow, s);
  }
}

TEST_CASE("layer_norm_grad and lookup_table_grad with Accumulate on the GPU: the bits of the op followed by sum",
          "[cuda][layer_norm][lookup_table][fold_grad_sums]") {
  require_gpu();
  // Bit for bit on one device (tests/unit/grad_sum_check.h): layer_norm_grad's
  // warp-per-row and block-per-row paths, and lookup_table_grad's fill and
  // runs kernels with the other part in W's dtype or widened from FP16/BF16.
  for (DType dt : kFloatTypes)
    for (const Shape& s : {Shape{7, 10}, Shape{33, 768}, Shape{4, 1100}})
      check_layer_norm_grad_accumulate(kGpu, dt, dt, s);
  for (DType narrow : {DType::f16, DType::bf16}) check_layer_norm_grad_accumulate(kGpu, DType::f32, narrow, {33, 768});
  check_lookup_table_grad_accumulate(kGpu, DType::f32, DType::f32);
  for (DType narrow : {DType::f16, DType::bf16}) {
    check_lookup_table_grad_accumulate(kGpu, DType::f32, narrow);
    check_lookup_table_grad_accumulate(kGpu, narrow, narrow);
  }
}

TEST_CASE("fused_add_layer_norm on the GPU: the bits of elementwise_add then layer_norm", "[cuda][layer_norm][fuse]") {
  require_gpu();
  // Bit for bit on one device (tests/unit/add_layer_norm_check.h), the
  // warp-per-row and block-per-row paths, Y of X's shape or trailing dims.
  for (DType dt : kFloatTypes)
    for (const Shape& s : {Shape{7, 10}, Shape{33, 768}, Shape{4, 1100}})
      check_fused_add_layer_norm(kGpu, dt, dt, dt, s, s);
  for (DType narrow : {DType::f16, DType::bf16}) {
    check_fused_add_layer_norm(kGpu, DType::f32, narrow, narrow, {2, 16, 768}, {2, 16, 768});
    check_fused_add_layer_norm(kGpu, DType::f32, narrow, DType::f32, {5, 1100}, {5, 1100});
  }
  check_fused_add_layer_norm(kGpu, DType::f32, DType::f32, DType::f16, {3, 16, 768}, {16, 768});
}
