// [cuda] Every op with a CUDA kernel against its CPU twin: the op runs as a
// one-op Program through the Executor on the CPU and on cuda:0 with the same
// random inputs (copied with Tensor::to), in FP32, FP16 and BF16.
//
// How close the two must be follows from how each kernel computes (the reason
// is stated at each comparison):
//  - identical: same functor, same inputs, same sequence of rounded operations
//    (selects, single adds or multiplies, conversions, the loss-scaler update).
//    NaN must meet NaN (GPUs and x86 make NaNs with different payloads).
//  - within a few ulps: functors with a multiply feeding an add, which nvcc
//    contracts into an FMA (one rounding instead of two), and libm functions
//    (erff, expf, tanhf: CUDA's are within 2 ulp, glibc's within 1-2 ulp).
//  - reductions (softmax rows, mean, long bias-gradient columns) add in another
//    order than the CPU's sequential loop. Both twins are then compared with
//    one reference computed in double (long double for mean) from the same
//    inputs, each within the error bound of its own order of additions; a
//    bound on CPU - GPU alone would be the CPU's (n-1)·u, too loose to notice a
//    lost term.
// Outputs rounded to FP16/BF16 add half an ulp of that type against a reference
// (store_rel / store_abs), and one ulp between two computed results. The runner
// and the comparisons are shared with the other op tests: tests/unit/cuda_compare.h.
//
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

#include "amp/loss_scaler.h"
#include "runtime/core/check.h"
#include "runtime/core/half.h"
#include "runtime/core/random.h"
#include "runtime/core/tensor.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"
#include "runtime/kernels/multi_tensor_plan.h"
#include "runtime/ops/broadcast.h"
#include "runtime/ops/grad_accumulate.h"
#include "tests/unit/column_sum_check.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/gradcheck.h"
#include "tests/unit/loss_scaling_op.h"
#include "tests/unit/mean_check.h"
#include "tests/unit/padded_classes_check.h"
#include "tests/unit/recompute_softmax_check.h"
#include "tests/unit/softmax_reference.h"
#include "tests/unit/top1_check.h"

#ifdef MIX_HAVE_CUDA
#include "runtime/cuda/context.h"
#endif

using namespace mix;
using namespace mix::testing;

namespace {

// ---- tensors ----------------------------------------------------------------------------

Tensor i64s(const Shape& s, const std::vector<int64_t>& v) { return mix::testing::i64_tensor(s, v); }

// The value fed as `name`.
const Tensor& feeds_value(const std::vector<std::pair<std::string, Tensor>>& feeds, const std::string& name) {
  for (auto& [n, t] : feeds)
    if (n == name) return t;
  FAIL("no feed " << name);
  return feeds.front().second;
}

Tensor i32s(const Shape& s, const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(s, DType::i32);
  REQUIRE(t.numel() == static_cast<int64_t>(v.size()));
  std::memcpy(t.raw(), v.data(), t.bytes());
  return t;
}

}  // namespace

// ---- activations --------------------------------------------------------------------------

TEST_CASE("relu, gelu, tanh and their gradients match the CPU", "[cuda][activation]") {
  require_gpu();
  const Shape s{37, 129};  // 4773 elements: several blocks, a ragged tail
  for (DType dt : kFloatTypes) {
    const Tensor x = random_tensor(s, dt, 11, -4.f, 4.f);
    const Tensor dy = random_tensor(s, dt, 12);
    const std::vector<float> xv = x.to_floats(), dyv = dy.to_floats();
    for (std::string type : {"relu", "gelu", "tanh"}) {
      const bool relu = type == "relu";
      const Tensor xin = relu ? with_specials(x, dt) : x;
      const OneOp fwd{make_op(type, {{"X", {"x"}}}, {{"Out", {"y"}}}), {{"x", xin}}};
      const Both f = run_both(fwd, {"y"});
      const bool reads_input = type == "gelu";
      const Tensor saved = reads_input ? xin : f.cpu.at("y");
      const OneOp bwd{
          make_op(type + "_grad", {{reads_input ? "X" : "Out", {"s"}}, {"Out@GRAD", {"dy"}}}, {{"X@GRAD", {"dx"}}}),
          {{"s", saved}, {"dy", dy}}};
      const Both b = run_both(bwd, {"dx"});
      const std::string what = type + " " + dname(dt);
      if (relu) {
        // A compare and a select: nothing rounds, so identical, specials included.
        expect_identical(f.gpu.at("y"), f.cpu.at("y"), what);
        expect_identical(b.gpu.at("dx"), b.cpu.at("dx"), what + " grad");
      } else if (type == "gelu") {
        // erff/expf differ by up to 2 + 1 ulp between CUDA and glibc; 1 + erf(x/sqrt2)
        // cancels for x < 0 (an absolute error of a few u, times |x|/2), and
        // GeluBwd's cdf + x * pdf is contracted into an FMA on the GPU. Per side,
        // 4u·(1 + |x|) (times |dy| for the grad) bounds the cancelling part and
        // 4u·|ref| the rest; expect_close_to_cpu allows twice that between them.
        const Tensor& ry = f.cpu.at("y");
        const std::vector<double> ryv = doubles(ry);
        expect_close_to_cpu(
            f.gpu.at("y"), ry, [&](int64_t i) { return 4 * kU * (1 + std::fabs(xv[i])) + 4 * kU * std::fabs(ryv[i]); },
            what);
        const std::vector<double> rdx = doubles(b.cpu.at("dx"));
        expect_close_to_cpu(
            b.gpu.at("dx"), b.cpu.at("dx"),
            [&](int64_t i) { return 4 * kU * (1 + std::fabs(xv[i])) * std::fabs(dyv[i]) + 4 * kU * std::fabs(rdx[i]); },
            what + " grad");
      } else {
        // tanhf: within 2 ulp on either side (4u relative each). TanhBwd's
        // 1 - y*y is an FMA on the GPU: at most u·y^2 <= u apart before the
        // multiply by dy.
        const std::vector<double> ry = doubles(f.cpu.at("y"));
        expect_close_to_cpu(
            f.gpu.at("y"), f.cpu.at("y"), [&](int64_t i) { return 4 * kU * std::fabs(ry[i]); }, what);
        const std::vector<double> rdx = doubles(b.cpu.at("dx"));
        expect_close_to_cpu(
            b.gpu.at("dx"), b.cpu.at("dx"),
            [&](int64_t i) { return 2 * kU * std::fabs(dyv[i]) + 2 * kU * std::fabs(rdx[i]); }, what + " grad");
      }
    }
  }
}

// ---- cast, scale, fill ------------------------------------------------------------------------

TEST_CASE("cast between float dtypes and integers is identical to the CPU", "[cuda][cast]") {
  require_gpu();
  // Rounding ties, overflow to inf, subnormals of every type, NaN and signed zeros.
  std::vector<float> v = {0.f,
                          -0.f,
                          1.f,
                          -1.f,
                          65504.f,
                          65519.f,
                          65520.f,
                          70000.f,
                          1e-8f,
                          6e-8f,
                          2.98e-8f,
                          1e-45f,
                          3.4e38f,
                          -3.4e38f,
                          1.f + 0x1p-11f,
                          1.f + 0x3p-11f,
                          1.f + 0x1p-8f,
                          1.f + 0x3p-8f,
                          1e-40f,
                          -1e-39f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::nanf("")};
  mix::Rng rng(5);
  while (v.size() < 3001) v.push_back(static_cast<float>(rng.normal() * 1000.0));
  const Shape s{static_cast<int64_t>(v.size())};
  for (DType from : kFloatTypes)
    for (DType to : kFloatTypes) {
      const OneOp c{make_op("cast", {{"X", {"x"}}}, {{"Out", {"y"}}}, {{"out_dtype", dname(to)}}),
                    {{"x", floats(s, v, from)}}};
      const Both r = run_both(c, {"y"});
      // Widening is exact and both round with round-to-nearest-even (half.h on the
      // GPU, F16C or the same portable code on the CPU): identical.
      expect_identical(r.gpu.at("y"), r.cpu.at("y"), "cast " + dname(from) + " -> " + dname(to));
    }
  const std::vector<int64_t> ints = {0, 1, -1, 2147483647, -2147483648LL, (1LL << 40) + 1, -(1LL << 53) - 1, 12345};
  const Shape is{static_cast<int64_t>(ints.size())};
  for (const char* to : {"i32", "f32"}) {
    const OneOp c{make_op("cast", {{"X", {"x"}}}, {{"Out", {"y"}}}, {{"out_dtype", std::string(to)}}),
                  {{"x", i64s(is, ints)}}};
    const Both r = run_both(c, {"y"});
    // static_cast on both (modular narrowing, round-to-nearest to float).
    expect_identical(r.gpu.at("y"), r.cpu.at("y"), std::string("cast i64 -> ") + to);
  }
  const OneOp c{make_op("cast", {{"X", {"x"}}}, {{"Out", {"y"}}}, {{"out_dtype", std::string("i64")}}),
                {{"x", i32s({3}, {-7, 0, 2147483647})}}};
  const Both r = run_both(c, {"y"});
  expect_identical(r.gpu.at("y"), r.cpu.at("y"), "cast i32 -> i64");
}

TEST_CASE("fused_cast over many tensors is identical to the CPU", "[cuda][cast]") {
  require_gpu();
  // 131 tensors: more than one launch's table (multi_tensor::kMaxTensors), an
  // empty one, and one past kLargeTensor elements (a launch of its own), each
  // with overflow, subnormals, NaN and signed zeros (with_specials).
  std::vector<std::pair<std::string, Tensor>> feeds_f32;
  std::vector<std::string> xs, outs;
  for (int i = 0; i < 131; ++i) {
    const int64_t n = i == 7 ? 0 : i == 100 ? (int64_t{1} << 22) + 5 : 1 + (i * 397) % 5000;
    xs.push_back(numbered("x", static_cast<size_t>(i)));
    outs.push_back(numbered("y", static_cast<size_t>(i)));
    feeds_f32.push_back({xs.back(), uniform_tensor({n}, 40 + static_cast<uint64_t>(i), -7e4f, 7e4f)});
  }
  for (DType from : kFloatTypes)
    for (DType to : kFloatTypes) {
      if (from == to) continue;
      std::vector<std::pair<std::string, Tensor>> feeds;
      for (auto& [name, t] : feeds_f32) feeds.push_back({name, with_specials(t, from)});
      const OpDesc op = make_op("fused_cast", {{"X", xs}}, {{"Out", outs}}, {{"out_dtype", dname(to)}});
      const auto cpu = run_ops_on({op}, feeds, cpu_device(), ExecEnv{}, outs);
      const auto gpu = run_ops_on({op}, feeds, kGpu, ExecEnv{}, outs);
      for (const std::string& y : outs)
        expect_identical(gpu.at(y), cpu.at(y), "fused_cast " + dname(from) + " -> " + dname(to) + " " + y);
    }
}

TEST_CASE("grad_accumulate over many tensors is identical to the CPU, add and finish", "[cuda][grad_accum]") {
  require_gpu();
  // As fused_cast's case: 131 gradients (more than one launch's table), an
  // empty one and one past kLargeTensor, with overflow, NaN and signed zeros;
  // accumulators start from FP32 values of their own.
  const int kTensors = 131;
  std::vector<std::string> xa, xb, xc, accs;
  std::vector<std::pair<std::string, Tensor>> f32_feeds, acc_feeds;
  for (int i = 0; i < kTensors; ++i) {
    const int64_t n = i == 7 ? 0 : i == 100 ? (int64_t{1} << 22) + 5 : 1 + (i * 397) % 5000;
    const auto k = static_cast<size_t>(i);
    for (auto* names : {&xa, &xb, &xc}) {
      names->push_back(numbered(names == &xa ? "xa" : names == &xb ? "xb" : "xc", k));
      f32_feeds.push_back({names->back(), uniform_tensor({n}, 300 + f32_feeds.size(), -7e4f, 7e4f)});
    }
    accs.push_back(grad_accumulator_name(xc.back()));
    acc_feeds.push_back({accs.back(), uniform_tensor({n}, 900 + k, -1e3f, 1e3f)});
  }
  auto accumulate = [&](const std::vector<std::string>& xs, const char* mode) {
    std::map<std::string, std::vector<std::string>> outs{{"AccumOut", accs}};
    if (std::string(mode) == "finish") outs["Out"] = xs;
    return make_op("grad_accumulate", {{"X", xs}, {"Accum", accs}}, outs, {{"mode", std::string(mode)}});
  };
  for (DType dt : kFloatTypes) {
    std::vector<std::pair<std::string, Tensor>> feeds = acc_feeds;
    for (auto& [name, t] : f32_feeds) feeds.push_back({name, with_specials(t, dt)});
    // Two micro-batches added, then the last one's finish.
    const std::vector<OpDesc> adds = {accumulate(xa, "add"), accumulate(xb, "add")};
    std::vector<OpDesc> all = adds;
    all.push_back(accumulate(xc, "finish"));
    std::vector<std::string> after_finish = xc;
    after_finish.insert(after_finish.end(), accs.begin(), accs.end());
    const auto cpu_adds = run_ops_on(adds, feeds, cpu_device(), ExecEnv{}, accs);
    const auto gpu_adds = run_ops_on(adds, feeds, kGpu, ExecEnv{}, accs);
    const auto cpu_all = run_ops_on(all, feeds, cpu_device(), ExecEnv{}, after_finish);
    const auto gpu_all = run_ops_on(all, feeds, kGpu, ExecEnv{}, after_finish);
    for (const std::string& a : accs) {
      expect_identical(gpu_adds.at(a), cpu_adds.at(a), "grad_accumulate add " + dname(dt) + " " + a);
      expect_identical(gpu_all.at(a), cpu_all.at(a), "grad_accumulate finish zeroes " + dname(dt) + " " + a);
    }
    for (const std::string& x : xc)
      expect_identical(gpu_all.at(x), cpu_all.at(x), "grad_accumulate finish " + dname(dt) + " " + x);
  }
}

TEST_CASE("the gradient norm and the clips on CUDA: the CPU's norm to an FP32 ulp, the clips bit for bit",
          "[cuda][clip]") {
  require_gpu();
  // 131 FP32 gradients as above (one launch's table and more, an empty one, one
  // launched alone), and every tenth from number 3 over two chunks of 16384 and
  // a bit (as test_multi_tensor_kernels_emulated), values up to 7e4: squares
  // far past FP32's sums' precision.
  std::vector<std::string> gs;
  std::vector<std::pair<std::string, Tensor>> feeds;
  for (int i = 0; i < 131; ++i) {
    const int64_t n = i == 7        ? 0
                      : i == 100    ? (int64_t{1} << 22) + 5
                      : i % 10 == 3 ? 2 * 16384 + 1 + i
                                    : 1 + (i * 397) % 5000;
    gs.push_back(numbered("g", static_cast<size_t>(i)));
    feeds.push_back({gs.back(), uniform_tensor({n}, 700 + static_cast<uint64_t>(i), -7e4f, 7e4f)});
  }
  const OpDesc norm_op = make_op("grad_global_norm", {{"X", gs}}, {{"Norm", {"norm"}}});
  const float cpu_norm = run_ops_on({norm_op}, feeds, cpu_device(), ExecEnv{}, {"norm"}).at("norm").data<float>()[0];
  const float gpu_norm = run_ops_on({norm_op}, feeds, kGpu, ExecEnv{}, {"norm"}).at("norm").data<float>()[0];
  // Both round an FP64 sum of ~5e6 squares to FP32; the sums differ only in
  // their order, by ~5e6 * 2^-53 relative, far below FP32's half ulp: the
  // roundings land on the same FP32 value or, at a tie's edge, on the next.
  CHECK(std::fabs(gpu_norm - cpu_norm) <= std::nextafter(cpu_norm, INFINITY) - cpu_norm);

  // The clips, from the same norm on both devices: identical bits.
  for (const float norm : {cpu_norm, INFINITY}) {
    std::vector<std::pair<std::string, Tensor>> with_norm = feeds;
    with_norm.push_back({"norm", Tensor::from_floats({1}, {norm})});
    const OpDesc clip = make_op("clip_by_global_norm", {{"X", gs}, {"Norm", {"norm"}}},
                                {{"Out", gs}, {"FoundInfiniteOut", {"found_inf"}}}, {{"max_norm", 1e3}});
    std::vector<std::string> results = gs;
    results.push_back("found_inf");
    const auto cpu = run_ops_on({clip}, with_norm, cpu_device(), ExecEnv{}, results);
    const auto gpu = run_ops_on({clip}, with_norm, kGpu, ExecEnv{}, results);
    for (const std::string& r : results) expect_identical(gpu.at(r), cpu.at(r), "clip_by_global_norm " + r);
    CHECK(gpu.at("found_inf").data<int32_t>()[0] == (std::isfinite(norm) ? 0 : 1));
  }
  std::vector<std::pair<std::string, Tensor>> special;
  for (auto& [name, t] : feeds) special.push_back({name, with_specials(t, DType::f32)});
  const OpDesc clamp = make_op("clip_by_value", {{"X", gs}}, {{"Out", gs}}, {{"max_value", 1e4}});
  const auto cpu = run_ops_on({clamp}, special, cpu_device(), ExecEnv{}, gs);
  const auto gpu = run_ops_on({clamp}, special, kGpu, ExecEnv{}, gs);
  for (const std::string& g : gs) expect_identical(gpu.at(g), cpu.at(g), "clip_by_value " + g);
}

TEST_CASE("scale matches the CPU", "[cuda][scale]") {
  require_gpu();
  const Shape s{50, 77};
  for (DType dt : kFloatTypes) {
    const Tensor x = with_specials(uniform_tensor(s, 21, -3.f, 3.f), dt);
    const std::vector<float> xv = x.to_floats();
    struct Case {
      double scale, bias;
      bool after;
    };
    for (const Case k : {Case{1.75, 0.0, true}, Case{-0.3, 0.25, false}, Case{1.75, 0.25, true}}) {
      const OneOp c{make_op("scale", {{"X", {"x"}}}, {{"Out", {"y"}}},
                            {{"scale", k.scale}, {"bias", k.bias}, {"bias_after_scale", k.after}}),
                    {{"x", x}}};
      const Both r = run_both(c, {"y"});
      const std::string what =
          "scale " + dname(dt) + " bias " + std::to_string(k.bias) + (k.after ? " after" : " before");
      if (k.bias == 0.0 || !k.after) {
        // scale * (x + bias) has no multiply feeding an add; scale * x + 0 may
        // become fma(scale, x, 0) = round(scale * x), the CPU's value (only the
        // sign of an underflowing product's zero could differ; none underflows).
        expect_identical(r.gpu.at("y"), r.cpu.at("y"), what);
      } else {
        // scale * x + bias is one FMA on the GPU: one rounding fewer, at most
        // u·|scale·x| apart, plus the final rounding u·|ref|.
        const std::vector<double> ref = doubles(r.cpu.at("y"));
        expect_close_to_cpu(
            r.gpu.at("y"), r.cpu.at("y"),
            [&](int64_t i) { return kU * std::fabs(k.scale * xv[i]) + kU * std::fabs(ref[i]); }, what);
      }
    }
  }
}

TEST_CASE("fill_constant and fill_like_scalar are identical to the CPU", "[cuda][fill]") {
  require_gpu();
  for (DType dt : kFloatTypes) {
    const OneOp c{make_op("fill_constant", {}, {{"Out", {"y"}}},
                          {{"shape", std::vector<int64_t>{3, 1000}}, {"dtype", dname(dt)}, {"value", 0.1}}),
                  {}};
    const Both r = run_both(c, {"y"});
    // One conversion of the same float on both sides.
    expect_identical(r.gpu.at("y"), r.cpu.at("y"), "fill_constant " + dname(dt));
    const OneOp l{
        make_op("fill_like_scalar", {{"X", {"x"}}}, {{"Out", {"y"}}}, {{"shape", std::vector<int64_t>{5, 7}}}),
        {{"x", floats({1}, {3.14159f}, dt)}}};
    const Both rl = run_both(l, {"y"});
    expect_identical(rl.gpu.at("y"), rl.cpu.at("y"), "fill_like_scalar " + dname(dt));
  }
}

// ---- sum, elementwise ---------------------------------------------------------------------------

TEST_CASE("sum of several inputs is identical to the CPU, in place too", "[cuda][sum]") {
  require_gpu();
  // Packed launches (runtime/cuda/launch.cuh) take whole packs of 8 halves or
  // 4 floats, then a tail one element at a time: 33 x 65 has both, 2 x 1024
  // packs only, and 3 elements fewer than one pack (the one-element path).
  for (DType dt : kFloatTypes)
    for (const Shape& s : {Shape{33, 65}, Shape{2, 1024}, Shape{1, 3}})
      for (int k : {1, 3, 11}) {  // 11 > 8 inputs per launch: the chunked path
        std::vector<std::pair<std::string, Tensor>> feeds;
        std::vector<std::string> names;
        for (int i = 0; i < k; ++i) {
          names.push_back(numbered("x", static_cast<size_t>(i)));
          feeds.push_back({names.back(), random_tensor(s, dt, 100 + i, -10.f, 10.f)});
        }
        for (bool in_place : {false, true}) {
          const std::string out = in_place ? names[0] : "y";
          const OneOp c{make_op("sum", {{"X", names}}, {{"Out", {out}}}), feeds};
          const Both r = run_both(c, {out});
          // FP32 adds in input order and one rounding on store, on both sides.
          expect_identical(
              r.gpu.at(out), r.cpu.at(out),
              "sum of " + std::to_string(k) + " " + dname(dt) + mix::shape_str(s) + (in_place ? " in place" : ""));
        }
      }
}

TEST_CASE("fused_add_relu and fused_sum_relu_grad are identical to the CPU", "[cuda][fused]") {
  require_gpu();
  // The same functors (fn::AddRelu, sum's FP32 adds in input order, then
  // fn::ReluBwd) and one rounding on store, on both sides: bit for bit. The
  // inputs hold infinities, a NaN, zeros of both signs and values that
  // overflow FP16; the shapes take the packed and the one-element paths.
  for (DType dt : kFloatTypes)
    for (const Shape& s : {Shape{33, 65}, Shape{2, 1024}, Shape{1, 3}}) {
      const std::string what = dname(dt) + mix::shape_str(s);
      const OneOp add{
          make_op("fused_add_relu", {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"out"}}}),
          {{"x", with_specials(uniform_tensor(s, 1, -4.f, 4.f), dt)}, {"y", random_tensor(s, dt, 2, -4.f, 4.f)}}};
      const Both a = run_both(add, {"out"});
      expect_identical(a.gpu.at("out"), a.cpu.at("out"), "fused_add_relu " + what);
      for (int k : {2, 3, 11}) {  // 11 > 8 inputs per launch: the chunked path
        std::vector<std::pair<std::string, Tensor>> feeds{{"y", with_specials(uniform_tensor(s, 3, -1.f, 1.f), dt)}};
        std::vector<std::string> parts;
        for (int i = 0; i < k; ++i) {
          parts.push_back(numbered("g", static_cast<size_t>(i)));
          feeds.push_back({parts.back(), random_tensor(s, dt, 10 + static_cast<uint64_t>(i), -10.f, 10.f)});
        }
        const OneOp grad{make_op("fused_sum_relu_grad", {{"Out", {"y"}}, {"Out@GRAD", parts}}, {{"X@GRAD", {"dx"}}}),
                         feeds};
        const Both g = run_both(grad, {"dx"});
        expect_identical(g.gpu.at("dx"), g.cpu.at("dx"), "fused_sum_relu_grad of " + std::to_string(k) + " " + what);
      }
    }
}

TEST_CASE("top1_correct counts what the CPU counts", "[cuda][top1]") {
  require_gpu();
  // An integer maximum over fn::argmax_key and an integer count: the order of
  // the block's comparisons and of the rows' atomic adds cannot change them,
  // so the counts are equal, ties and NaN rows included. Shapes: the MLP's
  // evaluation batch, one class, rows longer than a block, and rows of many
  // elements per thread.
  for (DType dt : kFloatTypes)
    for (DType label_dt : {DType::i64, DType::i32})
      for (auto [rows, classes] : {std::pair<int64_t, int64_t>{1000, 10}, {64, 1}, {33, 257}, {8, 5000}}) {
        const std::string what = dname(dt) + " logits, " + dname(label_dt) + " labels, " + std::to_string(rows) +
                                 " x " + std::to_string(classes);
        INFO(what);
        const Top1Case c = top1_case(rows, classes, dt, label_dt, 21);
        const OneOp op{make_op("top1_correct", {{"Logits", {"logits"}}, {"Label", {"label"}}}, {{"Correct", {"n"}}}),
                       {{"logits", c.logits}, {"label", c.label}}};
        const Both b = run_both(op, {"n"});
        CHECK(b.cpu.at("n").data<int64_t>()[0] == c.expected);
        CHECK(b.gpu.at("n").data<int64_t>()[0] == c.expected);
      }
}

TEST_CASE("elementwise_add/mul and their gradients match the CPU", "[cuda][elementwise]") {
  require_gpu();
  // Once more with the 64-bit broadcast indices meant for X past 2^32 elements.
  const bool wide = GENERATE(false, true);
  const LargeTensorPaths large(wide);
  struct Case {
    Shape x, y;
    int axis;
  };
  const Case cases[] = {
      {{64, 100}, {100}, -1},     // a bias: pre 64, n 100, post 1
      {{2, 3, 4, 5}, {3, 4}, 1},  // pre 2, n 12, post 5
      {{3, 4, 5}, {3}, 0},        // Y on X's leading dim: pre 1, n 3, post 20
      {{1500, 3, 2}, {3, 1}, 1},  // trailing 1 in Y; columns of 3000 terms (the tree path)
      {{3000, 40}, {40}, -1},     // a bias over 3000 rows: post 1, columns summed in row chunks
      {{4, 5}, {4, 5}, -1},       // same shape
      {{6, 9}, {1, 9}, -1},       // leading 1 in Y
      {{2, 3, 7}, {1}, -1},       // a scalar Y: one column of all 42 terms
      // Shapes the packed launches (runtime/cuda/launch.cuh) take in whole
      // packs of 8 halves or 4 floats, besides {3000, 40} and the same-shape
      // case above; the others run one element at a time, in some dtypes or all.
      {{2, 3, 16}, {3}, 1},  // post 16: a pack shares one Y element
      {{3, 2, 8}, {3}, 0},   // pre 1, post 16
  };
  for (DType dt : kFloatTypes)
    for (const Case& k : cases) {
      const Tensor x = random_tensor(k.x, dt, 31, -2.f, 2.f);
      const Tensor y = random_tensor(k.y, dt, 32, -2.f, 2.f);
      const Tensor dout = random_tensor(k.x, dt, 33);
      const mix::BroadcastDims d = mix::broadcast_dims(k.x, k.y, k.axis, "test");
      const std::string what =
          dname(dt) + " X" + mix::shape_str(k.x) + " Y" + mix::shape_str(k.y) + (wide ? " (64-bit indices)" : "");
      const std::map<std::string, Attr> attrs{{"axis", int64_t{k.axis}}};
      for (std::string type : {"elementwise_add", "elementwise_mul"}) {
        const bool mul = type == "elementwise_mul";
        const OneOp fwd{make_op(type, {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"out"}}}, attrs), {{"x", x}, {"y", y}}};
        const Both f = run_both(fwd, {"out"});
        // One add or multiply per element: identical.
        expect_identical(f.gpu.at("out"), f.cpu.at("out"), type + " " + what);

        std::map<std::string, std::vector<std::string>> ins{{"Y", {"y"}}, {"Out@GRAD", {"dout"}}};
        std::vector<std::pair<std::string, Tensor>> feeds{{"y", y}, {"dout", dout}};
        if (mul) {
          ins["X"] = {"x"};
          feeds.push_back({"x", x});
        }
        // elementwise_add_grad knows Y by the grad maker's attrs, not by reading it.
        std::map<std::string, Attr> grad_attrs = attrs;
        if (!mul) grad_attrs.insert({{"y_shape", k.y}, {"y_dtype", dname(dt)}});
        const OneOp bwd{make_op(type + "_grad", ins, {{"X@GRAD", {"dx"}}, {"Y@GRAD", {"dy"}}}, grad_attrs), feeds};
        const Both b = run_both(bwd, {"dx", "dy"});
        // dX is a copy (add) or one multiply (mul): identical.
        expect_identical(b.gpu.at("dx"), b.cpu.at("dx"), type + "_grad dX " + what);
        const int64_t m = d.pre * d.post;
        if (d.same_shape() || m <= 1024) {
          // Columns of up to 1024 terms: one thread each, adding in the CPU's
          // order, and no FMA (the adds are __fadd_rn): identical.
          expect_identical(b.gpu.at("dy"), b.cpu.at("dy"), type + "_grad dY " + what);
          continue;
        }
        // Longer columns, against the column sums in double of the same (rounded)
        // terms; the CPU's sequential loop is within (m - 1)·u·sum|terms|, then
        // the rounding on store. The GPU:
        //  - post 1: chunks of ceil(pre / chunks) rows, chunks = clamp(ceil(pre / 64),
        //    1, 1024) (elementwise.cu), each summed in order, then the chunk sums
        //    in order: (rows per chunk + chunks)·u·sum|terms|;
        //  - otherwise per-thread partial sums of ceil(m/256) terms, then an
        //    8-level tree: (ceil(m/256) + 8)·u·sum|terms|.
        const std::vector<float> xv = x.to_floats(), dv = dout.to_floats();
        const ColumnSumRef ref = column_sum_ref(d, dv, mul ? &xv : nullptr);
        const auto bound = [&](double terms) { return column_sum_bound(ref, terms, dt); };
        if (d.post == 1) {
          const int64_t chunks = std::clamp<int64_t>((d.pre + 63) / 64, 1, 1024);
          const int64_t rows_per_chunk = (d.pre + chunks - 1) / chunks;
          expect_within(b.gpu.at("dy"), ref.sum, bound(static_cast<double>(rows_per_chunk + chunks)),
                        type + "_grad dY (GPU row chunks) " + what);
        } else {
          expect_within(b.gpu.at("dy"), ref.sum, bound(static_cast<double>((m + 255) / 256 + 8)),
                        type + "_grad dY (GPU tree) " + what);
        }
        expect_within(b.cpu.at("dy"), ref.sum, bound(static_cast<double>(m)), type + "_grad dY (CPU) " + what);
      }
    }
}

// ---- mean ---------------------------------------------------------------------------------------

TEST_CASE("mean and mean_grad match the CPU", "[cuda][mean]") {
  require_gpu();
  for (DType dt : kFloatTypes)
    for (const Shape& s : {Shape{1}, Shape{1000}, Shape{317, 331}, Shape{3000000}}) {
      const Tensor x = random_tensor(s, dt, 41, -1.f, 3.f);
      const OneOp c{make_op("mean", {{"X", {"x"}}}, {{"Out", {"y"}}}), {{"x", x}}};
      const Both r = run_both(c, {"y"});
      const int64_t n = x.numel();
      const MeanRef ref = mean_ref(x);
      const std::string what = "mean " + dname(dt) + " of " + std::to_string(n);
      expect_within(r.gpu.at("y"), ref.mean, mean_bound(ref, gpu_mean_terms(n), dt), what + " (GPU)");
      expect_within(r.cpu.at("y"), ref.mean, mean_bound(ref, static_cast<double>(n), dt), what + " (CPU)");

      const Tensor dout = floats({1}, {0.7f}, dt);
      const OneOp g{make_op("mean_grad", {{"X", {"x"}}, {"Out@GRAD", {"dout"}}}, {{"X@GRAD", {"dx"}}}),
                    {{"x", x}, {"dout", dout}}};
      const Both rg = run_both(g, {"dx"});
      // dOut / n in double (IEEE division on both), one rounding: identical.
      expect_identical(rg.gpu.at("dx"), rg.cpu.at("dx"), "mean_grad " + dname(dt) + " of " + std::to_string(n));
    }
}

// ---- softmax, cross-entropy ------------------------------------------------------------------------

namespace {

// Softmax rows of both twins (output `out`) against `ref`, each within the bound
// of its own row sum (softmax_reference.h): gpu_terms on the GPU, the CPU's sequence.
void expect_softmax_rows(const Both& r, const std::string& out, const SoftmaxRef& ref, const SumTerms& gpu_terms,
                         DType dt, const std::string& what) {
  expect_within(r.gpu.at(out), ref.y, softmax_bound(ref, dt, gpu_terms), "softmax (GPU) " + what);
  expect_within(r.cpu.at(out), ref.y, softmax_bound(ref, dt, cpu_sum_terms), "softmax (CPU) " + what);
}

}  // namespace

TEST_CASE("softmax and softmax_grad match the CPU and a double reference", "[cuda][softmax]") {
  require_gpu();
  const float ninf = -std::numeric_limits<float>::infinity();
  for (DType dt : kFloatTypes)
    // A warp per row up to 1024 columns, a block beyond (softmax.cu): 1024 and
    // 1025 are the two sides of that line.
    for (const Shape& s :
         {Shape{7, 10}, Shape{33, 257}, Shape{3, 5000}, Shape{2, 3, 64}, Shape{1, 1}, Shape{5, 1024}, Shape{4, 1025}}) {
      std::vector<float> xv = uniform_tensor(s, 51, -5.f, 5.f).to_floats();
      const int64_t cols = s.back(), rows = static_cast<int64_t>(xv.size()) / cols;
      if (rows >= 2 && cols >= 4) {
        xv[1] = xv[3] = ninf;                                    // masked entries
        for (int64_t k = 0; k < cols; ++k) xv[cols + k] = ninf;  // a fully masked row: NaN, as in PyTorch
      }
      const Tensor x = floats(s, xv, dt);
      xv = x.to_floats();  // the values the kernels see
      const std::string what = dname(dt) + " " + mix::shape_str(s);
      const OneOp c{make_op("softmax", {{"X", {"x"}}}, {{"Out", {"y"}}}), {{"x", x}}};
      const Both r = run_both(c, {"y"});
      const SoftmaxRef ref = softmax_ref(xv, rows, cols);
      const SumTerms gpu_terms = [cols](int64_t n) { return gpu_row_terms(n, cols); };
      expect_softmax_rows(r, "y", ref, gpu_terms, dt, what);

      // The gradient from the same Out (the CPU's) and a random dOut.
      const Tensor y = r.cpu.at("y");
      const Tensor dy = random_tensor(s, dt, 52);
      const OneOp g{make_op("softmax_grad", {{"Out", {"y"}}, {"Out@GRAD", {"dy"}}}, {{"X@GRAD", {"dx"}}}),
                    {{"y", y}, {"dy", dy}}};
      const Both rg = run_both(g, {"dx"});
      // dx against the double reference, each twin within the bound of its own dot sum (softmax_reference.h).
      const std::vector<float> yv = y.to_floats(), dyv = dy.to_floats();
      const SoftmaxGradRef gref = softmax_grad_ref(ref, yv, dyv);
      expect_within(rg.gpu.at("dx"), gref.dx, softmax_grad_bound(ref, gref, yv, dyv, dt, gpu_terms),
                    "softmax_grad (GPU) " + what);
      expect_within(rg.cpu.at("dx"), gref.dx, softmax_grad_bound(ref, gref, yv, dyv, dt, cpu_sum_terms),
                    "softmax_grad (CPU) " + what);
    }
}

TEST_CASE("softmax_with_cross_entropy and its gradient match the CPU and a double reference", "[cuda][cross_entropy]") {
  require_gpu();
  struct Case {
    Shape logits;
    int64_t ignore;
    bool i32_labels;
  };
  const Case cases[] = {
      {{64, 10}, -100, false}, {{16, 1000}, 3, false}, {{5, 3, 300}, -100, true}, {{4, 1}, -100, false}};
  for (DType dt : kFloatTypes)
    for (const Case& k : cases) {
      const int64_t cols = k.logits.back(), rows = mix::shape_numel(k.logits) / cols;
      const Tensor x = random_tensor(k.logits, dt, 61, -6.f, 6.f);
      const std::vector<float> xv = x.to_floats();
      mix::Rng rng(62);
      std::vector<int64_t> labels(static_cast<size_t>(rows));
      for (auto& l : labels) l = static_cast<int64_t>(rng.below(static_cast<uint64_t>(cols)));
      labels[0] = k.ignore;  // an ignored row: loss 0, gradient 0
      if (rows > 2) labels[2] = cols - 1;
      Shape label_shape(k.logits.begin(), k.logits.end() - 1);
      label_shape.push_back(1);
      Tensor label = i64s(label_shape, labels);
      if (k.i32_labels) label = i32s(label_shape, std::vector<int32_t>(labels.begin(), labels.end()));
      const std::map<std::string, Attr> attrs{{"ignore_index", k.ignore}};
      const OneOp c{make_op("softmax_with_cross_entropy", {{"Logits", {"x"}}, {"Label", {"label"}}},
                            {{"Softmax", {"sm"}}, {"Loss", {"loss"}}}, attrs),
                    {{"x", x}, {"label", label}}};
      const Both r = run_both(c, {"sm", "loss"});
      const std::string what = dname(dt) + " " + mix::shape_str(k.logits);

      const SoftmaxRef ref = softmax_ref(xv, rows, cols);
      // A block per row, whatever its length (cross_entropy.cu).
      expect_softmax_rows(r, "sm", ref, gpu_block_row_terms, dt, what);
      // The loss against the double reference (softmax_reference.h); ignored rows are 0.
      const LossRef lref = cross_entropy_loss_ref(ref, xv, labels, k.ignore);
      expect_within(r.gpu.at("loss"), lref.loss, cross_entropy_loss_bound(ref, lref, dt, gpu_block_row_terms),
                    "loss (GPU) " + what);
      expect_within(r.cpu.at("loss"), lref.loss, cross_entropy_loss_bound(ref, lref, dt, cpu_sum_terms),
                    "loss (CPU) " + what);

      // The gradient from the same Softmax (the CPU's): (y - onehot) * dloss is a
      // subtract and a multiply, no FMA: identical.
      const Tensor dloss = random_tensor(label_shape, dt, 63);
      const OneOp g{make_op("softmax_with_cross_entropy_grad",
                            {{"Softmax", {"sm"}}, {"Label", {"label"}}, {"Loss@GRAD", {"dloss"}}},
                            {{"Logits@GRAD", {"dx"}}}, attrs),
                    {{"sm", r.cpu.at("sm")}, {"label", label}, {"dloss", dloss}}};
      const Both rg = run_both(g, {"dx"});
      expect_identical(rg.gpu.at("dx"), rg.cpu.at("dx"), "softmax_with_cross_entropy_grad " + what);
    }
}

TEST_CASE("softmax_with_cross_entropy without a stored softmax: the same gradient on the GPU",
          "[cuda][cross_entropy]") {
  require_gpu();
  // On one device the recomputed softmax repeats the stored one's operations
  // on the same logits and the same row max and sum (fn::softmax_as_stored):
  // the loss and Logits@GRAD must be the same bits. Rows of 10 classes (a warp
  // each in the grad) and of 3000 (a block, several values per thread), in
  // every dtype pairing of the op.
  for (const SoftmaxDtypes& pr : kSoftmaxDtypes)
    for (int64_t classes : {10, 3000}) {
      const Shape s{3, 4, classes};
      std::vector<int64_t> labels;
      for (int64_t i = 0; i < 12; ++i) labels.push_back(i % 10);
      const auto [stored, recomputed] = stored_and_recomputed_grads(
          to_dtype(uniform_tensor(s, 5, -30.f, 30.f), pr.logits), i64s({3, 4}, labels), pr.softmax, kGpu);
      expect_identical(recomputed, stored,
                       "Logits@GRAD, " + dname(pr.logits) + " logits, " + dname(pr.softmax) + " softmax, " +
                           std::to_string(classes) + " classes");
    }
}

TEST_CASE("softmax_with_cross_entropy and top1_correct on CUDA ignore a padded vocabulary's columns, bit for bit",
          "[cuda][cross_entropy][top1]") {
  require_gpu();
  // Attr valid_classes (GPT-2's vocabulary padded to 50,304): on the GPU, as
  // on the CPU (test_gpt2.cc), the padded logits give the unpadded logits'
  // loss, softmax and gradient bits, and the padding gets 0 and never wins.
  mix::testing::check_padded_classes(kGpu);
}

TEST_CASE("softmax_with_cross_entropy on CUDA: an out-of-range label poisons its row with NaN",
          "[cuda][gpu_only][cross_entropy]") {
  require_gpu();
  // The CPU kernel throws naming the row; the GPU cannot without a host round
  // trip, so the row's loss and gradient are NaN (see cross_entropy.cu).
  const Tensor x = random_tensor({3, 5}, DType::f32, 71);
  const Tensor label = i64s({3, 1}, {1, 5, 2});
  const OneOp c{make_op("softmax_with_cross_entropy", {{"Logits", {"x"}}, {"Label", {"label"}}},
                        {{"Softmax", {"sm"}}, {"Loss", {"loss"}}}),
                {{"x", x}, {"label", label}}};
  CHECK_THROWS_WITH(run_on(c, cpu_device(), {"loss"}), Catch::Matchers::Contains("label 5 at row 1"));
  const auto r = run_on(c, kGpu, {"sm", "loss"});
  const std::vector<float> loss = r.at("loss").to_floats();
  CHECK(std::isfinite(loss[0]));
  CHECK(std::isnan(loss[1]));
  CHECK(std::isfinite(loss[2]));
  const OneOp g{
      make_op("softmax_with_cross_entropy_grad", {{"Softmax", {"sm"}}, {"Label", {"label"}}, {"Loss@GRAD", {"dloss"}}},
              {{"Logits@GRAD", {"dx"}}}),
      {{"sm", r.at("sm")}, {"label", label}, {"dloss", Tensor::from_floats({3, 1}, {1.f, 1.f, 1.f})}}};
  const std::vector<float> dx = run_on(g, kGpu, {"dx"}).at("dx").to_floats();
  for (int64_t k = 0; k < 5; ++k) {
    CHECK(std::isfinite(dx[k]));
    CHECK(std::isnan(dx[5 + k]));
  }
}

// ---- reshape2 -------------------------------------------------------------------------------------

TEST_CASE("reshape2 on CUDA is a view of the device tensor", "[cuda][reshape2]") {
  require_gpu();
  Program p;
  p.add_var(var_desc("x", {2, 3, 4}, DType::f16));
  p.append_op(make_op("reshape2", {{"X", {"x"}}}, {{"Out", {"y"}}}, {{"shape", std::vector<int64_t>{0, -1}}}));
  p.append_op(make_op("reshape2_grad", {{"X", {"x"}}, {"Out@GRAD", {"y"}}}, {{"X@GRAD", {"dx"}}}));
  const Tensor x = random_tensor({2, 3, 4}, DType::f16, 81);
  Scope scope;
  scope.set("x", x.to(kGpu));
  ExecEnv env;
  env.device = kGpu;
  Executor(p, {"x", "y", "dx"}).run(scope, env);
  CHECK(scope.get("y").shape() == Shape{2, 12});
  CHECK(scope.get("y").shares_storage(scope.get("x")));
  CHECK(scope.get("dx").shape() == Shape{2, 3, 4});
  CHECK(scope.get("dx").shares_storage(scope.get("x")));
  CHECK(scope.get("y").device() == kGpu);
  expect_identical(scope.get("dx").to(cpu_device()), x, "reshape2 round trip");
}

// ---- optimizer updates ------------------------------------------------------------------------------

namespace {

// Inputs every update op has: the FP32 master "p", its gradient "g", the
// learning rate "lr" and, when skip >= 0, an i32 SkipUpdate flag "skip".
std::map<std::string, std::vector<std::string>> update_ins(int skip) {
  std::map<std::string, std::vector<std::string>> in{{"Param", {"p"}}, {"Grad", {"g"}}, {"LearningRate", {"lr"}}};
  if (skip >= 0) in["SkipUpdate"] = {"skip"};
  return in;
}
std::vector<std::pair<std::string, Tensor>> update_feeds(const Tensor& p, const Tensor& g, float lr, int skip) {
  std::vector<std::pair<std::string, Tensor>> f{{"p", p}, {"g", g}, {"lr", Tensor::from_floats({1}, {lr})}};
  if (skip >= 0) f.push_back({"skip", i32s({1}, {skip})});
  return f;
}

}  // namespace

TEST_CASE("sgd and momentum updates match the CPU; a skipped step changes nothing", "[cuda][optim]") {
  require_gpu();
  // 33330 elements share a multi-tensor launch; just over kLargeTensor (4M)
  // get a launch of their own.
  const int64_t cols = GENERATE(int64_t{101}, multi_tensor::kLargeTensor / 330 + 1);
  const Shape s{330, cols};
  const Tensor p = uniform_tensor(s, 91, -2.f, 2.f);
  const Tensor g = uniform_tensor(s, 92, -1.f, 1.f);
  const Tensor buf = uniform_tensor(s, 93, -0.5f, 0.5f);
  const std::vector<float> pv = p.to_floats(), gv = g.to_floats(), bv = buf.to_floats();
  const double wd = 0.01;
  // Every value entering the update (lr, mu, wd <= 1): each of the few roundings
  // either side makes (fewer on the GPU, which contracts a * b + c into FMAs)
  // is at most u times an intermediate bounded by about twice this.
  const auto magnitude = [&](int64_t i) {
    return std::fabs(pv[i]) + std::fabs(gv[i]) + std::fabs(bv[i]) + wd * std::fabs(pv[i]);
  };
  for (int skip : {-1, 0, 1}) {
    const std::string what = skip < 0 ? "" : skip ? " (skipped)" : " (not skipped)";
    const OneOp sgd{make_op("sgd", update_ins(skip), {{"ParamOut", {"p"}}}, {{"weight_decay", wd}}),
                    update_feeds(p, g, 0.05f, skip)};
    const Both r = run_both(sgd, {"p"});
    if (skip == 1) {
      expect_identical(r.gpu.at("p"), p, "sgd" + what);
      expect_identical(r.cpu.at("p"), p, "sgd on the CPU" + what);
    } else {
      expect_close_to_cpu(
          r.gpu.at("p"), r.cpu.at("p"), [&](int64_t i) { return 4 * kU * magnitude(i); }, "sgd" + what);
    }
    for (bool nesterov : {false, true}) {
      auto ins = update_ins(skip);
      ins["Velocity"] = {"v"};
      auto feeds = update_feeds(p, g, 0.05f, skip);
      feeds.push_back({"v", buf});
      const OneOp mom{make_op("momentum", ins, {{"ParamOut", {"p"}}, {"VelocityOut", {"v"}}},
                              {{"mu", 0.9}, {"weight_decay", wd}, {"use_nesterov", nesterov}}),
                      feeds};
      const Both rm = run_both(mom, {"p", "v"});
      const std::string w = std::string("momentum") + (nesterov ? " nesterov" : "") + what;
      if (skip == 1) {
        expect_identical(rm.gpu.at("p"), p, w);
        expect_identical(rm.gpu.at("v"), buf, w + " velocity");
      } else {
        expect_close_to_cpu(
            rm.gpu.at("p"), rm.cpu.at("p"), [&](int64_t i) { return 8 * kU * magnitude(i); }, w);
        expect_close_to_cpu(
            rm.gpu.at("v"), rm.cpu.at("v"), [&](int64_t i) { return 4 * kU * magnitude(i); }, w + " velocity");
      }
    }
  }
}

TEST_CASE("adamw matches the CPU at several steps, bias corrections computed on the device", "[cuda][optim]") {
  require_gpu();
  // 33410 elements share a multi-tensor launch; just over kLargeTensor (4M)
  // get a launch of their own.
  const int64_t cols = GENERATE(int64_t{130}, multi_tensor::kLargeTensor / 257 + 1);
  const Shape s{257, cols};
  const Tensor p = uniform_tensor(s, 101, -2.f, 2.f);
  const Tensor g = uniform_tensor(s, 102, -1.f, 1.f);
  const Tensor m = uniform_tensor(s, 103, -0.1f, 0.1f);
  const Tensor v = uniform_tensor(s, 104, 0.f, 0.01f);
  const std::vector<float> pv = p.to_floats(), gv = g.to_floats(), mv = m.to_floats(), vv = v.to_floats();
  const double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0.01;
  const float lr = 1e-3f;
  for (int64_t step : {1, 2, 10, 1000}) {
    for (int skip : {0, 1}) {
      auto ins = update_ins(skip);
      ins["Moment1"] = {"m"};
      ins["Moment2"] = {"v"};
      ins["Step"] = {"t"};
      auto feeds = update_feeds(p, g, lr, skip);
      feeds.push_back({"m", m});
      feeds.push_back({"v", v});
      feeds.push_back({"t", i64s({1}, {step})});
      const OneOp op{make_op("adamw", ins, {{"ParamOut", {"p"}}, {"Moment1Out", {"m"}}, {"Moment2Out", {"v"}}},
                             {{"beta1", beta1}, {"beta2", beta2}, {"epsilon", eps}, {"weight_decay", wd}}),
                     feeds};
      const Both r = run_both(op, {"p", "m", "v"});
      const std::string what = "adamw step " + std::to_string(step) + (skip ? " (skipped)" : "");
      if (skip) {
        expect_identical(r.gpu.at("p"), p, what);
        expect_identical(r.gpu.at("m"), m, what + " m");
        expect_identical(r.gpu.at("v"), v, what + " v");
        continue;
      }
      // The moments: beta * m + (1 - beta) * g (* g): FMAs on the GPU, so within
      // a few u of the terms' magnitudes. The parameter: the decay and the step
      // size * m / denom, whose size U is taken from the CPU's new moments; the
      // GPU's double pow is within 2 ulp of glibc's, far below float precision.
      const std::vector<float> m1 = r.cpu.at("m").to_floats(), v1 = r.cpu.at("v").to_floats();
      const double bias1 = 1 - std::pow(beta1, static_cast<double>(step));
      const double bias2 = 1 - std::pow(beta2, static_cast<double>(step));
      const auto update_size = [&](int64_t i) {
        return lr / bias1 * std::fabs(m1[i]) / (std::sqrt(v1[i]) / std::sqrt(bias2) + eps);
      };
      expect_close_to_cpu(
          r.gpu.at("m"), r.cpu.at("m"), [&](int64_t i) { return 4 * kU * (std::fabs(mv[i]) + std::fabs(gv[i])); },
          what + " m");
      expect_close_to_cpu(
          r.gpu.at("v"), r.cpu.at("v"), [&](int64_t i) { return 4 * kU * (std::fabs(vv[i]) + gv[i] * gv[i]); },
          what + " v");
      // m/denom: relative errors of m (~4u·(|m|+|g|)/|m|, large where m nearly
      // cancels) and of the denominator enter the update; bounded by 16u of the
      // update with m's own absolute bound carried through.
      expect_close_to_cpu(
          r.gpu.at("p"), r.cpu.at("p"),
          [&](int64_t i) {
            const double m_err = 4 * kU * (std::fabs(mv[i]) + std::fabs(gv[i]));
            const double denom = std::sqrt(v1[i]) / std::sqrt(bias2) + eps;
            return 4 * kU * std::fabs(pv[i]) + 16 * kU * update_size(i) + lr / bias1 * m_err / denom;
          },
          what);
    }
  }
}

TEST_CASE("update ops over many parameters on CUDA: each as its own op would update it", "[cuda][optim]") {
  require_gpu();
  // 140 parameters: small ones sharing multi-tensor launches (more than one
  // launch's table of kMaxTensors, 128), two over kLargeTensor elements,
  // launched alone, one empty. The
  // grouped op must give each parameter and its state exactly the bits of a
  // one-parameter op (the same functor on the same values: the single-
  // parameter tests above compare those with the CPU, in shared launches and
  // alone).
  std::vector<Shape> shapes;
  for (int64_t i = 0; i < 140; ++i) shapes.push_back({(i * 389) % 3000 + 1, 3});
  static_assert(multi_tensor::kMaxTensors < 140 - 3, "the shared tensors must need two tables");
  shapes[5] = {multi_tensor::kLargeTensor / 1000 + 1, 1000};
  shapes[50] = {multi_tensor::kLargeTensor + 1};
  shapes[20] = {0};
  struct Kind {
    const char* type;
    std::vector<std::pair<const char*, const char*>> state;  // input slot, output slot
    std::map<std::string, Attr> attrs;
  };
  const Kind kinds[] = {
      {"sgd", {}, {{"weight_decay", 0.01}}},
      {"momentum", {{"Velocity", "VelocityOut"}}, {{"mu", 0.9}, {"weight_decay", 0.01}, {"use_nesterov", true}}},
      {"adamw",
       {{"Moment1", "Moment1Out"}, {"Moment2", "Moment2Out"}},
       {{"beta1", 0.9}, {"beta2", 0.999}, {"epsilon", 1e-8}, {"weight_decay", 0.01}}}};
  for (const Kind& kind : kinds)
    for (int skip : {0, 1}) {
      std::vector<std::pair<std::string, Tensor>> feeds{
          {"lr", Tensor::from_floats({1}, {0.01f})}, {"skip", i32s({1}, {skip})}, {"t", i64s({1}, {3})}};
      std::vector<std::string> results;
      std::vector<OpDesc> singles;
      std::map<std::string, std::vector<std::string>> ins{
          {"LearningRate", {"lr"}}, {"SkipUpdate", {"skip"}}, {"Param", {}}, {"Grad", {}}};
      std::map<std::string, std::vector<std::string>> outs{{"ParamOut", {}}};
      for (size_t k = 0; k < shapes.size(); ++k) {
        const std::string id = std::to_string(k);
        std::map<std::string, std::vector<std::string>> one_in{
            {"LearningRate", {"lr"}}, {"SkipUpdate", {"skip"}}, {"Param", {"p" + id}}, {"Grad", {"g" + id}}};
        std::map<std::string, std::vector<std::string>> one_out{{"ParamOut", {"p" + id}}};
        feeds.push_back({"p" + id, uniform_tensor(shapes[k], 800 + k, -2.f, 2.f)});
        feeds.push_back({"g" + id, uniform_tensor(shapes[k], 900 + k, -1.f, 1.f)});
        results.push_back("p" + id);
        for (auto& [in_slot, out_slot] : kind.state) {
          const std::string name = std::string(in_slot) + id;
          // Second moments must be non-negative; the first moment and velocity any sign.
          const float lo = std::string(in_slot) == "Moment2" ? 0.f : -0.1f;
          feeds.push_back({name, uniform_tensor(shapes[k], 1000 + 7 * k, lo, 0.1f)});
          results.push_back(name);
          one_in[in_slot] = {name};
          one_out[out_slot] = {name};
          ins[in_slot].push_back(name);
          outs[out_slot].push_back(name);
        }
        if (std::string(kind.type) == "adamw") one_in["Step"] = {"t"};
        ins["Param"].push_back("p" + id);
        ins["Grad"].push_back("g" + id);
        outs["ParamOut"].push_back("p" + id);
        singles.push_back(make_op(kind.type, one_in, one_out, kind.attrs));
      }
      if (std::string(kind.type) == "adamw") ins["Step"] = {"t"};
      const std::vector<OpDesc> grouped = {make_op(kind.type, ins, outs, kind.attrs)};
      ExecEnv env;
      const auto one_op = run_ops_on(grouped, feeds, kGpu, env, results);
      const auto many_ops = run_ops_on(singles, feeds, kGpu, env, results);
      const std::string what = std::string(kind.type) + (skip ? " (skipped)" : "");
      for (size_t i = 0; i < results.size(); ++i) {
        expect_identical(one_op.at(results[i]), many_ops.at(results[i]), what + " " + results[i]);
        if (skip) expect_identical(one_op.at(results[i]), feeds_value(feeds, results[i]), what + " unchanged");
      }
      if (!skip) {
        INFO(what);  // the update did happen, in the large and in the last parameters too
        for (const char* p : {"p5", "p50", "p69"}) CHECK(one_op.at(p).to_floats() != feeds_value(feeds, p).to_floats());
      }
    }
}

TEST_CASE("increment_step advances the device step unless the step is skipped", "[cuda][optim]") {
  require_gpu();
  for (int skip : {-1, 0, 1}) {
    std::map<std::string, std::vector<std::string>> ins{{"Step", {"t"}}};
    std::vector<std::pair<std::string, Tensor>> feeds{{"t", i64s({1}, {41})}};
    if (skip >= 0) {
      ins["SkipUpdate"] = {"skip"};
      feeds.push_back({"skip", i32s({1}, {skip})});
    }
    const OneOp c{make_op("increment_step", ins, {{"StepOut", {"t"}}}), feeds};
    const Both r = run_both(c, {"t"});
    expect_identical(r.gpu.at("t"), r.cpu.at("t"), "increment_step skip " + std::to_string(skip));
    CHECK(r.gpu.at("t").data<int64_t>()[0] == (skip == 1 ? 41 : 42));
  }
}

// ---- AMP ------------------------------------------------------------------------------------------

TEST_CASE("check_finite_and_unscale and the fused cast twin match the CPU, flag included", "[cuda][amp]") {
  require_gpu();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    float scale;
    int bad;   // 0: all finite; 1: an inf in X[1]; 2: a NaN in X[2]
    int prev;  // FoundInfiniteIn: -1 absent, else its value
  };
  const Case cases[] = {{1024.f, 0, -1}, {3.f, 0, -1}, {1024.f, 1, -1}, {65536.f, 2, 0}, {3.f, 0, 1}, {0.5f, 0, 0}};
  for (const Case& k : cases)
    for (bool fused : {false, true}) {
      std::vector<Tensor> xs = {random_tensor({1000}, DType::f32, 111, -1e4f, 1e4f),
                                random_tensor({37, 5}, DType::f16, 112, -6e4f, 6e4f),
                                random_tensor({300}, DType::bf16, 113, -1e4f, 1e4f)};
      if (k.bad == 1) {
        std::vector<float> v = xs[1].to_floats();
        v[17] = -inf;
        xs[1] = floats(xs[1].shape(), v, DType::f16);
      } else if (k.bad == 2) {
        std::vector<float> v = xs[2].to_floats();
        v[299] = std::nanf("");
        xs[2] = floats(xs[2].shape(), v, DType::bf16);
      }
      std::vector<std::pair<std::string, Tensor>> feeds{{"scale", Tensor::from_floats({1}, {k.scale})}};
      std::vector<std::string> xn, outn;
      for (size_t i = 0; i < xs.size(); ++i) {
        xn.push_back(numbered("g", i));
        outn.push_back(fused ? xn.back() + "_f32" : xn.back());  // in place unless cast
        feeds.push_back({xn.back(), xs[i]});
      }
      std::map<std::string, std::vector<std::string>> ins{{"X", xn}, {"Scale", {"scale"}}};
      if (k.prev >= 0) {
        ins["FoundInfiniteIn"] = {"found_in"};
        feeds.push_back({"found_in", i32s({1}, {k.prev})});
      }
      const std::string type = fused ? "cast_check_finite_and_unscale" : "check_finite_and_unscale";
      const OneOp c{make_op(type, ins, {{"Out", outn}, {"FoundInfinite", {"found"}}}), feeds};
      std::vector<std::string> results = outn;
      results.push_back("found");
      const Both r = run_both(c, results);
      const std::string what =
          type + " scale " + std::to_string(k.scale) + " case " + std::to_string(k.bad) + "/" + std::to_string(k.prev);
      // g * (1/scale): the same reciprocal, one multiply, one rounding on store.
      for (auto& o : outn) expect_identical(r.gpu.at(o), r.cpu.at(o), what + " " + o);
      expect_identical(r.gpu.at("found"), r.cpu.at("found"), what + " found_inf");
      CHECK(r.gpu.at("found").data<int32_t>()[0] == (k.bad != 0 || k.prev == 1 ? 1 : 0));
    }
}

TEST_CASE("check_finite_and_unscale on CUDA: an invalid scale raises found_inf", "[cuda][gpu_only][amp]") {
  require_gpu();
  // The CPU op throws; the device cannot, so the step is flagged (see amp_ops.cu).
  const OneOp c{make_op("check_finite_and_unscale", {{"X", {"g"}}, {"Scale", {"scale"}}},
                        {{"Out", {"g"}}, {"FoundInfinite", {"found"}}}),
                {{"g", Tensor::from_floats({4}, {1, 2, 3, 4})}, {"scale", Tensor::from_floats({1}, {0.f})}}};
  CHECK_THROWS_WITH(run_on(c, cpu_device(), {"found"}), Catch::Matchers::Contains("positive and finite"));
  CHECK(run_on(c, kGpu, {"found"}).at("found").data<int32_t>()[0] == 1);
}

namespace {

// The scaler's state variables and the update_loss_scaling op over them (in place).
struct ScalerProgram {
  Program p;
  explicit ScalerProgram(const mix::amp::LossScalerConfig& config, DType flag_dtype) {
    p.add_var(var_desc("found", {1}, flag_dtype));
    p.add_var(var_desc("scale", {1}, DType::f32));
    for (const char* n : {"good", "bad", "skipped", "at_min"}) p.add_var(var_desc(n, {1}, DType::i64));
    p.append_op(mix::testing::update_loss_scaling_op("found", {"scale", "good", "bad", "skipped", "at_min"},
                                                     mix::amp::to_op_attrs(config)));
  }
};

struct ScalerRun {
  ScalerProgram prog;
  Device device;
  Scope scope;
  ExecEnv env;
  DType flag_dtype;
  ScalerRun(const mix::amp::LossScalerConfig& config, const mix::amp::LossScalerState& s, Device d, DType fd)
      : prog(config, fd), device(d), flag_dtype(fd) {
    env.device = d;
    scope.set("scale", Tensor::from_floats({1}, {s.scale}).to(d));
    scope.set("good", i64s({1}, {s.good_steps}).to(d));
    scope.set("bad", i64s({1}, {s.bad_steps}).to(d));
    scope.set("skipped", i64s({1}, {s.skipped_steps}).to(d));
    scope.set("at_min", i64s({1}, {s.consecutive_skips_at_min}).to(d));
  }
  // One step with the given flag value (stored in flag_dtype).
  void step(float flag) {
    Tensor f;
    if (flag_dtype == DType::f32) f = Tensor::from_floats({1}, {flag});
    if (flag_dtype == DType::i32) f = i32s({1}, {static_cast<int32_t>(flag)});
    if (flag_dtype == DType::i64) f = i64s({1}, {static_cast<int64_t>(flag)});
    scope.set("found", f.to(device));
    Executor(prog.p, {"found", "scale", "good", "bad", "skipped", "at_min"}).run(scope, env);
  }
  mix::amp::LossScalerState state() const {
    mix::amp::LossScalerState s;
    s.scale = scope.get("scale").to(cpu_device()).data<float>()[0];
    s.good_steps = scope.get("good").to(cpu_device()).data<int64_t>()[0];
    s.bad_steps = scope.get("bad").to(cpu_device()).data<int64_t>()[0];
    s.skipped_steps = scope.get("skipped").to(cpu_device()).data<int64_t>()[0];
    s.consecutive_skips_at_min = scope.get("at_min").to(cpu_device()).data<int64_t>()[0];
    return s;
  }
};

void expect_same_state(const mix::amp::LossScalerState& gpu, const mix::amp::LossScalerState& cpu) {
  CHECK(mix::float_bits(gpu.scale) == mix::float_bits(cpu.scale));
  CHECK(gpu.good_steps == cpu.good_steps);
  CHECK(gpu.bad_steps == cpu.bad_steps);
  CHECK(gpu.skipped_steps == cpu.skipped_steps);
  CHECK(gpu.consecutive_skips_at_min == cpu.consecutive_skips_at_min);
}

}  // namespace

TEST_CASE("update_loss_scaling on the device takes the CPU's decisions step by step", "[cuda][amp]") {
  require_gpu();
  mix::amp::LossScalerConfig config = mix::amp::preset("paddle");
  config.incr_every_n_steps = 25;
  config.decr_every_n_nan_or_inf = 2;
  config.decr_ratio = 0.5f;
  config.init_loss_scaling = 1024.f;
  config.min_loss_scaling = 2.f;
  config.on_min_scale = mix::amp::LossScalerConfig::OnMinScale::continue_;
  for (const char* mode : {"dynamic", "static", "none"})
    for (DType fd : {DType::i32, DType::f32, DType::i64}) {
      config.mode = mix::amp::parse_mode(mode);
      const mix::amp::LossScalerState start = mix::amp::initial_state(config);
      ScalerRun cpu(config, start, cpu_device(), fd), gpu(config, start, kGpu, fd);
      mix::Rng rng(121);
      for (int step = 0; step < 600; ++step) {
        // Runs of overflows (down to the minimum and stuck there), and long finite
        // stretches (growth); a NaN flag counts as an overflow.
        const bool burst = (step / 100) % 3 == 1;
        float flag = rng.uniform() < (burst ? 0.9 : 0.03) ? 1.f : 0.f;
        if (fd == DType::f32 && flag != 0.f && step % 7 == 0) flag = std::nanf("");
        cpu.step(flag);
        gpu.step(flag);
        INFO("mode " << mode << ", flag " << dname(fd) << ", step " << step);
        // The same MIX_HD update on both (one float multiply per change): identical.
        expect_same_state(gpu.state(), cpu.state());
      }
    }
}

// The CUDA op makes no host round trip: it writes the stuck state, and the
// host check after the step raises the CPU op's error from it.
TEST_CASE("update_loss_scaling on CUDA leaves the scaler's stuck error to the host check", "[cuda][gpu_only][amp]") {
  require_gpu();
  mix::amp::LossScalerConfig config = mix::amp::preset("paddle");
  config.init_loss_scaling = 1.f;
  config.min_loss_scaling = 1.f;
  config.max_skips_at_min = 3;
  mix::amp::LossScalerState start = mix::amp::initial_state(config);
  ScalerRun cpu(config, start, cpu_device(), DType::i32), gpu(config, start, kGpu, DType::i32);
  for (int step = 0; step < 2; ++step) {
    cpu.step(1.f);
    gpu.step(1.f);
  }
  std::string cpu_error, gpu_error;
  try {
    cpu.step(1.f);
  } catch (const mix::Error& e) {
    cpu_error = e.what();
  }
  gpu.step(1.f);  // no throw: no flag read in the step
  try {
    mix::amp::check_loss_scale_not_stuck(gpu.prog.p, gpu.scope);
  } catch (const mix::Error& e) {
    gpu_error = e.what();
  }
  CHECK_THAT(cpu_error, Catch::Matchers::Contains("stuck at the minimum"));
  CHECK(gpu_error == cpu_error);
  expect_same_state(gpu.state(), cpu.state());
  CHECK(gpu.state().consecutive_skips_at_min == 3);
}

TEST_CASE("inject_overflow writes inf into the first element at its step only", "[cuda][amp]") {
  require_gpu();
  for (int64_t env_step : {4, 5}) {
    const OneOp c{make_op("inject_overflow", {{"X", {"a", "b", "c"}}}, {{"Out", {"a", "b", "c"}}},
                          {{"step", int64_t{5}}, {"rank", int64_t{-1}}}),
                  {{"a", random_tensor({10}, DType::f32, 131)},
                   {"b", random_tensor({3, 4}, DType::f16, 132)},
                   {"c", random_tensor({7}, DType::bf16, 133)}},
                  env_step};
    const Both r = run_both(c, {"a", "b", "c"});
    for (const char* n : {"a", "b", "c"}) {
      expect_identical(r.gpu.at(n), r.cpu.at(n), std::string("inject_overflow ") + n);
      CHECK(std::isinf(r.gpu.at(n).item_float(0)) == (env_step == 5));
    }
    // The step in device memory (ExecEnv::device_step, as a recorded step has
    // it): the kernel compares that, not the host's ExecEnv::step.
    Tensor step_now = Tensor::empty({1}, DType::i64);
    step_now.data<int64_t>()[0] = env_step;
    step_now = step_now.to(kGpu);
    ExecEnv env;
    env.step = env_step == 5 ? 4 : 5;  // the other step: the host's value must not decide
    env.device_step = step_now.data<int64_t>();
    const auto on_device = run_ops_on({c.op}, c.feeds, kGpu, env, {"a", "b", "c"});
    for (const char* n : {"a", "b", "c"})
      expect_identical(on_device.at(n), r.cpu.at(n), std::string("inject_overflow, step on the device, ") + n);
  }
}
