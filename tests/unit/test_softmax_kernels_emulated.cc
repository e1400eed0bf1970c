// softmax's and softmax_with_cross_entropy's CUDA row kernels
// (runtime/ops/cuda/softmax_kernels.cuh, cross_entropy_kernels.cuh), their
// very source, run on the CPU (tests/unit/cuda_emulation.h) and launched as
// softmax.cu and cross_entropy.cu launch them: rows of a warp and of a block,
// a grid that covers the rows and one block that must stride over them. It
// runs everywhere, so a change to the kernels' indexing, masks or label
// handling is checked on every build; test_cuda_ops and
// test_cuda_transformer_ops check the GPU itself where one is lent.
//
// What is compared:
//  - softmax and softmax_grad, plain and causal, in each dtype pairing, and
//    the CPU twins beside them: each against the double reference within the
//    error bound of its own order of additions (softmax_reference.h); masked
//    keys exactly +0, and never read (dOut there holds NaN and inf);
//  - cross-entropy's forward over a padded vocabulary (attr valid_classes):
//    the Softmax and the loss against the double reference over the real
//    classes, each twin within its own bound; the padding's Softmax exactly
//    +0; RowStats' max the reference's exactly, its sum within the bound of
//    the kernel's additions; without a Softmax the same loss and RowStats
//    bits; an ignored row's loss 0, and NaN for a label outside the real
//    classes (a padding class, a negative one), which the CPU twin reports
//    as an error instead;
//  - its grad, from the CPU twin's Softmax or from its logits and RowStats:
//    the CPU twin's bits ((y - onehot)·dloss is a subtract and a multiply,
//    the same functor on the same inputs); the padding's and an ignored
//    row's gradient +0, an out-of-range label's row NaN; and on the emulated
//    forward's own outputs, the gradient recomputed from RowStats is the one
//    read from the Softmax, bit for bit (fn::softmax_as_stored).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/half.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/emulated_tensors.h"
#include "tests/unit/softmax_reference.h"

// The emulation and its row launch, then the kernels (cuda_emulation.h defines
// CUDA's keywords as macros).
#include "tests/unit/emulated_row_launch.h"

#include "runtime/ops/cuda/cross_entropy_kernels.cuh"  // and softmax_kernels.cuh

using namespace mix;
using namespace mix::testing;
namespace kernels = mix::cuda;

namespace {

// ---- softmax and softmax_grad ----------------------------------------------------------------

struct SoftmaxRows {
  Shape shape;  // [..., T, S] when causal
  bool causal, strided;
};
const SoftmaxRows kSoftmaxRows[] = {
    {{10, 70}, false, false},   // a warp a row, 8 rows a block: 2 blocks, the second part-full
    {{10, 70}, false, true},    // the same rows through one block
    {{3, 1100}, false, false},  // a block a row: 5 values a thread, some 4
    {{3, 1100}, false, true},    {{2, 16, 16}, true, false},  // T == S: prefixes from 1 key to 16
    {{2, 6, 70}, true, true},                                 // T < S: queries after a prefix of keys
    {{1, 3, 1100}, true, false},                              // causal rows of a block
};

std::string what_of(const SoftmaxRows& c, DType x, DType y) {
  return dname(x) + " " + shape_str(c.shape) + " -> " + dname(y) + (c.causal ? ", causal" : "") +
         (c.strided ? ", one block" : "");
}

// X is the logits' storage type, Y the output's (the same, or FP32 beside
// FP16/BF16 X: attr out_dtype), DY Out@GRAD's (Y's, or FP16/BF16 beside an
// FP32 Out); X@GRAD is in X's type.
template <typename X, typename Y, typename DY>
void check_softmax(DType x_dt, DType y_dt, DType dy_dt) {
  for (const SoftmaxRows& c : kSoftmaxRows) {
    const std::string what = what_of(c, x_dt, y_dt);
    INFO(what);
    const int64_t cols = c.shape.back(), rows = shape_numel(c.shape) / cols;
    const int64_t t = c.causal ? c.shape[c.shape.size() - 2] : 0;
    std::vector<float> xf = random_tensor(c.shape, x_dt, 801, -5.f, 5.f).to_floats();
    if (!c.causal) {  // masked entries, and a fully masked row (NaN, as in PyTorch)
      const float ninf = -INFINITY;
      xf[1] = xf[3] = ninf;
      for (int64_t k = 0; k < cols; ++k) xf[static_cast<size_t>(cols + k)] = ninf;
    }
    const Tensor xt = floats(c.shape, xf, x_dt);
    const std::vector<float> xv = xt.to_floats();  // the values the kernels see
    std::map<std::string, Attr> attrs{{"axis", int64_t{-1}}, {"causal", c.causal}};
    std::map<std::string, Attr> grad_attrs = attrs;
    if (y_dt != x_dt) {
      attrs["out_dtype"] = dname(y_dt);
      grad_attrs["x_grad_dtype"] = dname(x_dt);
    }

    const SoftmaxRef ref =
        softmax_ref(xv, rows, cols, [&](int64_t r) { return t > 0 ? fn::causal_valid_cols(r, t, cols) : cols; });
    const std::vector<int64_t> masked = ref.masked_entries();
    const SumTerms gpu_terms = [cols](int64_t n) { return gpu_row_terms(n, cols); };

    // The forward: softmax_rows, and the CPU twin.
    const std::vector<X> x = values_of<X>(xt);
    std::vector<Y> y(x.size(), from_float<Y>(NAN));
    launch_row_groups(rows, cols, c.strided, [&](auto threads) {
      kernels::softmax_rows<X, Y, decltype(threads)::value>(x.data(), y.data(), rows, cols, t);
    });
    const Tensor cpu_y = run_ops_on({make_op("softmax", {{"X", {"x"}}}, {{"Out", {"y"}}}, attrs)}, {{"x", xt}},
                                    cpu_device(), ExecEnv{}, {"y"})
                             .at("y");
    const Tensor yt = tensor_of(y, c.shape, y_dt);
    expect_within(yt, ref.y, softmax_bound(ref, y_dt, gpu_terms), "softmax (emulated)");
    expect_within(cpu_y, ref.y, softmax_bound(ref, y_dt, cpu_sum_terms), "softmax (CPU)");
    expect_exact_zeros(yt, masked, "softmax's masked keys (emulated)");

    // The gradient from the CPU's Out, with NaN, inf and a large value in dOut
    // on masked keys: they are never read.
    std::vector<float> dyf = random_tensor(c.shape, dy_dt, 802).to_floats();
    for (size_t q = 0; q < masked.size(); ++q)
      dyf[static_cast<size_t>(masked[q])] = q % 3 == 0 ? NAN : q % 3 == 1 ? INFINITY : 1e4f;
    const Tensor dyt = floats(c.shape, dyf, dy_dt);
    const std::vector<Y> yin = values_of<Y>(cpu_y);
    const std::vector<DY> dy = values_of<DY>(dyt);
    std::vector<X> dx(x.size(), from_float<X>(NAN));
    launch_row_groups(rows, cols, c.strided, [&](auto threads) {
      kernels::softmax_grad_rows<Y, DY, X, decltype(threads)::value>(yin.data(), dy.data(), dx.data(), rows, cols, t);
    });
    const Tensor cpu_dx =
        run_ops_on({make_op("softmax_grad", {{"Out", {"y"}}, {"Out@GRAD", {"dy"}}}, {{"X@GRAD", {"dx"}}}, grad_attrs)},
                   {{"y", cpu_y}, {"dy", dyt}}, cpu_device(), ExecEnv{}, {"dx"})
            .at("dx");
    const std::vector<float> yv = cpu_y.to_floats(), dyv = dyt.to_floats();
    const SoftmaxGradRef gref = softmax_grad_ref(ref, yv, dyv);
    const Tensor dxt = tensor_of(dx, c.shape, x_dt);
    expect_within(dxt, gref.dx, softmax_grad_bound(ref, gref, yv, dyv, x_dt, gpu_terms), "softmax_grad (emulated)");
    expect_within(cpu_dx, gref.dx, softmax_grad_bound(ref, gref, yv, dyv, x_dt, cpu_sum_terms), "softmax_grad (CPU)");
    expect_exact_zeros(dxt, masked, "softmax_grad's masked keys (emulated)");
  }
}

// ---- softmax_with_cross_entropy and its grad ---------------------------------------------------

constexpr int64_t kIgnore = -100;

struct XentRows {
  int64_t classes, valid;  // logits per row, and the real classes among them (attr valid_classes)
  std::vector<int64_t> labels;
  bool strided;
};
// Rows with a label of the padding (valid) and a negative one: out of range.
// The forward gives every row a block; the grad a warp up to 1024 classes, else a block.
const XentRows kXentRows[] = {
    {128, 100, {0, 99, kIgnore, 5, 100, -3, 42}, false},
    {128, 100, {0, 99, kIgnore, 5, 100, -3, 42}, true},
    {1152, 1100, {1099, kIgnore, 1107, 17}, false},
    {1152, 1100, {1099, kIgnore, 1107, 17}, true},
};

bool out_of_range(int64_t label, int64_t valid) { return label != kIgnore && (label < 0 || label >= valid); }

std::string what_of(const XentRows& c, DType x, DType y, DType label) {
  return dname(x) + " logits [" + std::to_string(c.labels.size()) + ", " + std::to_string(c.classes) + "] (" +
         std::to_string(c.valid) + " real), " + dname(y) + " softmax, " + dname(label) + " labels" +
         (c.strided ? ", one block" : "");
}

// What the forward kernel wrote; y is empty when no Softmax was asked for.
template <typename Y>
struct XentForward {
  std::vector<Y> y, loss;
  std::vector<float> stats;
};

template <typename X, typename Y, typename L>
XentForward<Y> emulated_forward(const XentRows& c, const std::vector<X>& x, const std::vector<L>& labels,
                                bool with_softmax) {
  const auto rows = static_cast<int64_t>(labels.size());
  XentForward<Y> f;
  f.y.assign(with_softmax ? x.size() : 0, from_float<Y>(NAN));
  f.loss.assign(labels.size(), from_float<Y>(NAN));
  f.stats.assign(2 * labels.size(), NAN);
  // cross_entropy.cu's launch: a block a row, up to 65535 blocks.
  emulated::run_grid(
      c.strided ? 1u : static_cast<unsigned>(rows), 1,
      [&] {
        kernels::softmax_cross_entropy_rows<X, Y, L>(x.data(), labels.data(), with_softmax ? f.y.data() : nullptr,
                                                     f.stats.data(), f.loss.data(), rows, c.classes, c.valid, kIgnore);
      },
      kernels::kBlock);
  return f;
}

template <typename X, typename Y, typename L>
std::vector<X> emulated_grad(const XentRows& c, kernels::SoftmaxSource<Y, X> src, const std::vector<L>& labels,
                             const Tensor& dloss) {
  const auto rows = static_cast<int64_t>(labels.size());
  std::vector<X> dx(static_cast<size_t>(rows * c.classes), from_float<X>(NAN));
  const kernels::ScalarRef d{dloss.raw(), dloss.dtype()};
  launch_row_groups(rows, c.classes, c.strided, [&](auto threads) {
    kernels::softmax_cross_entropy_grad_rows<Y, X, L, decltype(threads)::value>(src, labels.data(), d, dx.data(), rows,
                                                                                c.classes, c.valid, kIgnore);
  });
  return dx;
}

// got against want bit for bit, except the rows of an out-of-range label, which must be all NaN in got.
template <typename T>
void expect_rows(const std::vector<T>& got, const std::vector<T>& want, const XentRows& c, const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  std::vector<T> got_kept, want_kept;
  int64_t not_nan = 0;
  for (size_t r = 0; r < c.labels.size(); ++r)
    for (int64_t k = 0; k < c.classes; ++k) {
      const size_t e = r * static_cast<size_t>(c.classes) + static_cast<size_t>(k);
      if (out_of_range(c.labels[r], c.valid)) {
        not_nan += !std::isnan(to_float(got[e]));
      } else {
        got_kept.push_back(got[e]);
        want_kept.push_back(want[e]);
      }
    }
  CHECK(not_nan == 0);
  expect_same_bits(got_kept, want_kept, what + ", rows in range");
}

template <typename X, typename Y, typename L>
void check_cross_entropy(const XentRows& c, DType x_dt, DType y_dt, DType label_dt) {
  const std::string what = what_of(c, x_dt, y_dt, label_dt);
  INFO(what);
  const auto rows = static_cast<int64_t>(c.labels.size());
  const Shape shape{rows, c.classes};
  const Tensor xt = random_tensor(shape, x_dt, 811, -6.f, 6.f);
  const std::vector<float> xv = xt.to_floats();
  const std::vector<X> x = values_of<X>(xt);
  const std::vector<L> labels(c.labels.begin(), c.labels.end());
  // The CPU twin reports an out-of-range label as an error: it gets those rows ignored.
  std::vector<int64_t> twin_labels = c.labels;
  std::vector<size_t> bad_rows;
  for (size_t r = 0; r < twin_labels.size(); ++r)
    if (out_of_range(twin_labels[r], c.valid)) {
      twin_labels[r] = kIgnore;
      bad_rows.push_back(r);
    }

  const SoftmaxRef ref = softmax_ref(xv, rows, c.classes, [&](int64_t) { return c.valid; });
  const SumTerms block_terms = gpu_block_row_terms;  // the forward: a block a row

  // The forward, with the Softmax and without.
  const XentForward<Y> f = emulated_forward<X, Y, L>(c, x, labels, true);
  const XentForward<Y> bare = emulated_forward<X, Y, L>(c, x, labels, false);
  const Tensor yt = tensor_of(f.y, shape, y_dt);
  expect_within(yt, ref.y, softmax_bound(ref, y_dt, block_terms), "Softmax (emulated)");
  expect_exact_zeros(yt, ref.masked_entries(), "the padding's Softmax (emulated)");
  LossRef lref = cross_entropy_loss_ref(ref, xv, twin_labels, kIgnore);
  for (size_t r : bad_rows) lref.loss[r] = NAN;  // expect_within: NaN must meet NaN
  expect_within(tensor_of(f.loss, {rows}, y_dt), lref.loss, cross_entropy_loss_bound(ref, lref, y_dt, block_terms),
                "Loss (emulated)");
  // RowStats: the max is exact; the sum of exponentials within the bound of
  // its additions and its expf terms (4u each).
  for (int64_t r = 0; r < rows; ++r) {
    INFO("row " << r);
    CHECK(f.stats[static_cast<size_t>(2 * r)] == static_cast<float>(ref.max[static_cast<size_t>(r)]));
    const double s = std::exp(ref.lse[static_cast<size_t>(r)]);
    CHECK(std::fabs(f.stats[static_cast<size_t>(2 * r + 1)] - s) <=
          static_cast<double>(block_terms(c.valid) + 8) * kU * s);
  }
  expect_same_bits(bare.loss, f.loss, "Loss without a Softmax against with it");
  expect_same_bits(bare.stats, f.stats, "RowStats without a Softmax against with it");

  // The CPU twin, forward both ways and grad both ways.
  std::map<std::string, Attr> attrs{{"ignore_index", kIgnore}, {"valid_classes", c.valid}};
  std::map<std::string, Attr> grad_attrs = attrs;
  if (y_dt != x_dt) {
    attrs["out_dtype"] = dname(y_dt);
    grad_attrs["x_grad_dtype"] = dname(x_dt);
  }
  std::map<std::string, Attr> recompute_attrs = grad_attrs;
  recompute_attrs["softmax_dtype"] = dname(y_dt);
  const Tensor twin_label = i64_tensor({rows, 1}, twin_labels);
  const Tensor dloss = random_tensor({rows, 1}, y_dt, 812, 0.5f, 2.f);
  const auto cpu = run_ops_on(
      {make_op("softmax_with_cross_entropy", {{"Logits", {"x"}}, {"Label", {"label"}}},
               {{"Softmax", {"y"}}, {"Loss", {"loss"}}}, attrs),
       make_op("softmax_with_cross_entropy", {{"Logits", {"x"}}, {"Label", {"label"}}},
               {{"RowStats", {"stats"}}, {"Loss", {"loss2"}}}, attrs),
       make_op("softmax_with_cross_entropy_grad", {{"Softmax", {"y"}}, {"Label", {"label"}}, {"Loss@GRAD", {"dloss"}}},
               {{"Logits@GRAD", {"dx"}}}, grad_attrs),
       make_op("softmax_with_cross_entropy_grad",
               {{"Logits", {"x"}}, {"RowStats", {"stats"}}, {"Label", {"label"}}, {"Loss@GRAD", {"dloss"}}},
               {{"Logits@GRAD", {"dx2"}}}, recompute_attrs)},
      {{"x", xt}, {"label", twin_label}, {"dloss", dloss}}, cpu_device(), ExecEnv{},
      {"y", "loss", "stats", "dx", "dx2"});
  expect_within(cpu.at("y"), ref.y, softmax_bound(ref, y_dt, cpu_sum_terms), "Softmax (CPU)");
  LossRef twin_lref = cross_entropy_loss_ref(ref, xv, twin_labels, kIgnore);
  expect_within(cpu.at("loss"), twin_lref.loss, cross_entropy_loss_bound(ref, twin_lref, y_dt, cpu_sum_terms),
                "Loss (CPU)");

  // The grad kernel from the CPU twin's Softmax, and from its logits and RowStats.
  const std::vector<Y> cpu_y = values_of<Y>(cpu.at("y"));
  const std::vector<float> cpu_stats = values_of<float>(cpu.at("stats"));
  const std::vector<X> stored = emulated_grad<X, Y, L>(c, {cpu_y.data(), nullptr, nullptr}, labels, dloss);
  const std::vector<X> recomputed = emulated_grad<X, Y, L>(c, {nullptr, x.data(), cpu_stats.data()}, labels, dloss);
  expect_rows(stored, values_of<X>(cpu.at("dx")), c, "Logits@GRAD from the stored Softmax against the CPU");
  expect_rows(recomputed, values_of<X>(cpu.at("dx2")), c, "Logits@GRAD recomputed from RowStats against the CPU");
  std::vector<int64_t> zeros;  // the padding of rows in range, and every column of an ignored row
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < c.classes; ++k)
      if (c.labels[static_cast<size_t>(r)] == kIgnore || (k >= c.valid && !out_of_range(c.labels[r], c.valid)))
        zeros.push_back(r * c.classes + k);
  expect_exact_zeros(tensor_of(stored, shape, x_dt), zeros, "the padding's and an ignored row's Logits@GRAD");

  // On the emulated forward's own outputs the two ways are the same bits.
  const std::vector<X> own_stored = emulated_grad<X, Y, L>(c, {f.y.data(), nullptr, nullptr}, labels, dloss);
  const std::vector<X> own_recomputed = emulated_grad<X, Y, L>(c, {nullptr, x.data(), f.stats.data()}, labels, dloss);
  expect_same_bits(own_recomputed, own_stored, "Logits@GRAD recomputed against stored, on the kernel's own forward");
}

template <typename X, typename Y>
void check_cross_entropy(DType x_dt, DType y_dt) {
  // The label type changes only how a label is loaded: i64 for the grids that
  // cover the rows, i32 for the ones that stride.
  for (const XentRows& c : kXentRows)
    if (c.strided)
      check_cross_entropy<X, Y, int32_t>(c, x_dt, y_dt, DType::i32);
    else
      check_cross_entropy<X, Y, int64_t>(c, x_dt, y_dt, DType::i64);
}

}  // namespace

TEST_CASE("softmax's and softmax_grad's kernels, emulated: within the bound of the double reference, as the CPU",
          "[softmax][emulated]") {
  check_softmax<float, float, float>(DType::f32, DType::f32, DType::f32);
  check_softmax<half_t, half_t, half_t>(DType::f16, DType::f16, DType::f16);
  check_softmax<bf16_t, bf16_t, bf16_t>(DType::bf16, DType::bf16, DType::bf16);
  // AMP's black-list softmax: FP16 X, FP32 Out (out_dtype), and an FP16 Out@GRAD.
  check_softmax<half_t, float, half_t>(DType::f16, DType::f32, DType::f16);
}

TEST_CASE(
    "softmax_with_cross_entropy's kernels, emulated: a padded vocabulary, ignored labels and labels out of range, and "
    "the CPU's gradient bits",
    "[cross_entropy][emulated]") {
  check_cross_entropy<float, float>(DType::f32, DType::f32);
  check_cross_entropy<half_t, half_t>(DType::f16, DType::f16);
  check_cross_entropy<bf16_t, bf16_t>(DType::bf16, DType::bf16);
  // AMP's loss: FP16/BF16 logits, FP32 Softmax and Loss (out_dtype).
  check_cross_entropy<half_t, float>(DType::f16, DType::f32);
  check_cross_entropy<bf16_t, float>(DType::bf16, DType::f32);
}
