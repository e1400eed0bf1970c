// batch_norm's channels-last CUDA kernels
// (runtime/ops/cuda/batch_norm_channels_last_kernels.cuh), their very source,
// run on the CPU (tests/unit/cuda_emulation.h) and launched as
// batch_norm_channels_last.cu launches them: the partial sums with their
// block of threads and shared memory, the per-channel finalize blocks and
// their double tree, and the maps by column groups or element by element. It
// runs everywhere, so a change to the split, the gathers or the maps'
// indexing is checked on every build; test_cuda_conv_ops checks the GPU
// itself where one is lent.
//
// What is compared:
//  - Whole passes against the CPU's batch_norm and batch_norm_grad (NHWC),
//    bit for bit, on exact data: small integers in X and dY, a power of two of
//    rows, and in the backward a SavedVariance (1/std) that is a power of two.
//    Then every sum is exact, in FP32 and in double, in any order, and so is
//    every quotient by the rows, so the kernels' chunked FP32 sums and the
//    CPU's double sums are the same numbers, and the same functors make the
//    same bits of them. A wrong index, a missed or repeated row, a channel's
//    statistic used for another shows as a differing value.
//  - On random data, where the order of the sums shows, each pass on its own:
//    the partial sums bit for bit with bn_partials_reference.h (the same
//    threads' sums, gathered on the host); the finalize within an FP32 ulp of
//    the same functors on the host's double sums of those partials (doubles
//    added in another order differ by far less than an FP32 ulp, so the
//    rounded result is the same float or its neighbour); the maps bit for bit
//    with the CPU's functors applied with the kernels' own statistics.
//  - The finalize alone over more chunks than its block has threads.
//  - Evaluation, which sums nothing, bit for bit with the CPU on random data.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/kernels/bn_channel_sums.h"
#include "runtime/kernels/functors.h"
#include "tests/unit/bn_partials_reference.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/emulated_tensors.h"

// The emulation and its map launches, then the kernels (cuda_emulation.h
// defines CUDA's keywords as macros).
#include "tests/unit/emulated_map_launch.h"

#include "runtime/ops/cuda/batch_norm_channels_last_kernels.cuh"

using namespace mix;
using namespace mix::testing;
namespace cu = mix::cuda;
using kernels::BnSumGeometry;

namespace {

constexpr float kEps = 1e-5f;
constexpr float kMomentum = 0.9f;

// X's shape (channels last: C is the last dim) and where the kernels' arrays
// sit: `offset` elements past device memory's alignment (1: a view into a
// buffer, which the kernels must read unpacked), dY (backward) and Z (forward)
// `second_offset` elements past it.
struct Case {
  Shape shape;
  int offset = 0, second_offset = 0;
};
int64_t channels(const Case& k) { return k.shape.back(); }
int64_t rows(const Case& k) { return shape_numel(k.shape) / channels(k); }
std::string what_of(const Case& k, DType dt) {
  return dname(dt) + " " + shape_str(k.shape) + (k.offset ? ", one element past alignment" : "") +
         (k.second_offset ? ", dY and Z one element past alignment" : "");
}
// Whether the kernels can take this case in packs of V channels (the partial
// sums) and column groups of V (the maps) when they read X alone (and write
// Y), and when they also read dY or Z.
bool packs_x(const Case& k, int v) { return channels(k) % v == 0 && k.offset == 0; }
bool packs_all(const Case& k, int v) { return packs_x(k, v) && k.second_offset == 0; }
// Forward pass 3 reads Z with a residual only.
bool normalize_packs(const Case& k, int v, bool residual) { return residual ? packs_all(k, v) : packs_x(k, v); }

// Exact-data cases (rows a power of two). [64, 8, 8, 24] packs: FP16 3
// groups of 8 channels in a partly idle tile, over 4 chunks of rows; FP32 6
// groups of 4 over 8 chunks. [16, 8, 8, 6] takes one channel a thread over 2
// chunks; [16, 5] one chunk; [4, 4, 4, 40] one element past alignment,
// unpacked: 40 channels in 2 tiles. Channels are few and rows many because
// the emulation's cost is a finalize block of 256 threads per channel.
const Case kExactCases[] = {{{64, 8, 8, 24}}, {{16, 8, 8, 6}}, {{16, 5}}, {{4, 4, 4, 40}, 1}};
// Random-data cases: rows no power of two; the last with X aligned but dY and Z not.
const Case kRandomCases[] = {{{8, 9, 9, 24}}, {{8, 11, 11, 6}}, {{8, 9, 9, 16}, 1}, {{8, 9, 9, 16}, 0, 1}};

enum class Fusion { none, relu, residual_relu };
const char* fusion_name(Fusion f) {
  return f == Fusion::none ? "" : f == Fusion::relu ? ", fuse_with_relu" : ", fuse_with_relu + Z";
}

// Integers in [-4, 4] stored in dt (FP16 and BF16 hold them exactly).
Tensor small_integers(const Shape& s, DType dt, uint64_t seed) {
  std::vector<float> v = uniform_tensor(s, seed, -4.49f, 4.49f).to_floats();
  for (float& e : v) e = std::round(e);
  return floats(s, v, dt);
}

// ---- the launches, as batch_norm_channels_last.cu makes them ------------------------------

// Pass 1 over g's split; T is X's storage type.
template <typename T, typename Terms>
BnPartials emulated_partials(const BnSumGeometry& g, const Terms& terms) {
  BnPartials p{std::vector<float>(static_cast<size_t>(g.c * g.chunks), NAN),
               std::vector<float>(static_cast<size_t>(g.c * g.chunks), NAN)};
  emulated::run_grid(
      static_cast<unsigned>(g.tiles), static_cast<unsigned>(g.chunks),
      [&] {
        if (g.vec == 1)
          cu::bn_chunk_partials<1>(g, terms, p.first.data(), p.second.data());
        else
          cu::bn_chunk_partials<cu::kPackWidth<T>>(g, terms, p.first.data(), p.second.data());
      },
      kernels::kBnSumThreads);
  return p;
}

// A pass 3 map over X [rows, c]; returns whether it ran by column groups.
template <int V, typename F>
bool emulated_channel_map(int64_t rows, int64_t c, F f) {
  if (rows * c == 0) return false;
  if (!cu::bn_map_by_groups<V>(c, f)) {
    emulated_grid_stride(rows * c, f);
    return false;
  }
  emulated::run_grid(
      static_cast<unsigned>(cu::bn_column_group_blocks(rows, c / V)), 1,
      [&] { cu::bn_column_group_kernel<V>(rows, c, f); }, cu::kMapThreads);
  return true;
}

// The per-channel FP32 inputs of a batch_norm.
struct Params {
  std::vector<float> scale, bias, mean, var;  // mean, var: the running statistics (forward) or saved ones (backward)
};
Params params(int64_t c, uint64_t seed) {
  const Shape s{c};
  return {uniform_tensor(s, seed, 0.5f, 1.5f).to_floats(), uniform_tensor(s, seed + 1, -0.5f, 0.5f).to_floats(),
          uniform_tensor(s, seed + 2, -1.f, 1.f).to_floats(), uniform_tensor(s, seed + 3, 0.5f, 2.f).to_floats()};
}

// Forward passes 1 and 2 of bn_channels_last_train_forward: the statistics,
// MeanOut and VarianceOut over the running statistics (in place, as ResNet runs it).
struct Stats {
  BnSumGeometry g;
  BnPartials partials;
  std::vector<float> mean_out, var_out, saved_mean, saved_inv_std;
};
template <typename T>
Stats emulated_train_stats(const Case& k, const Tensor& x, const Params& p) {
  const int64_t c = channels(k), m = rows(k);
  const Placed<T> xs(values_of<T>(x), k.offset, x.dtype());
  Stats st;
  st.g = kernels::bn_sum_geometry(m, c, cu::bn_sums_packed<T>(c, xs.p, nullptr) ? cu::kPackWidth<T> : 1);
  st.partials = emulated_partials<T>(st.g, kernels::BnStatsTerms<T>{xs.p});
  st.mean_out = p.mean;
  st.var_out = p.var;
  st.saved_mean.assign(static_cast<size_t>(c), NAN);
  st.saved_inv_std.assign(static_cast<size_t>(c), NAN);
  emulated::run_grid(
      static_cast<unsigned>(c), 1,
      [&] {
        cu::bn_stats_finalize<T>(xs.p, st.partials.first.data(), st.partials.second.data(), st.g.chunks, m,
                                 st.mean_out.data(), st.var_out.data(), kMomentum, kEps, st.mean_out.data(),
                                 st.var_out.data(), st.saved_mean.data(), st.saved_inv_std.data());
      },
      cu::kBlock);
  return st;
}

// Forward pass 3 with these statistics (the saved ones in training, the
// running mean and their inv_std in evaluation).
template <typename T>
struct Normalized {
  std::vector<T> y;
  bool grouped;  // it ran by column groups
};
template <typename T>
Normalized<T> emulated_normalize(const Case& k, const Tensor& x, const Tensor& z, const std::vector<float>& mean,
                                 const std::vector<float>& inv_std, const Params& p, Fusion fusion) {
  const auto n = static_cast<size_t>(x.numel());
  const Placed<T> xs(values_of<T>(x), k.offset, x.dtype()), zs(values_of<T>(z), k.second_offset, x.dtype());
  Placed<T> ys(std::vector<T>(n, from_float<T>(NAN)), k.offset, x.dtype());
  const bool grouped = emulated_channel_map<cu::kPackWidth<T>>(
      rows(k), channels(k),
      cu::BnNormalizeMap<T>{xs.p, fusion == Fusion::residual_relu ? zs.p : nullptr, ys.p, mean.data(), inv_std.data(),
                            p.scale.data(), p.bias.data(), channels(k), fusion != Fusion::none});
  return {ys.values(n), grouped};
}

template <typename T>
struct Backward {
  BnSumGeometry g;
  BnPartials partials;
  std::vector<float> dscale, dbias, mean_g, mean_g_xhat;
  std::vector<T> dx;
  bool grouped = false;
};

// bn_channels_last_backward from the saved statistics in p.mean and p.var (1/std).
template <typename T>
Backward<T> emulated_backward(const Case& k, const Tensor& x, const Tensor& dy, const Params& p, bool relu) {
  const int64_t c = channels(k), m = rows(k);
  const auto n = static_cast<size_t>(x.numel());
  const Placed<T> xs(values_of<T>(x), k.offset, x.dtype()), dys(values_of<T>(dy), k.second_offset, x.dtype());
  Placed<T> dxs(std::vector<T>(n, from_float<T>(NAN)), k.offset, x.dtype());
  Backward<T> b;
  b.g = kernels::bn_sum_geometry(m, c, cu::bn_sums_packed<T>(c, xs.p, dys.p) ? cu::kPackWidth<T> : 1);
  b.partials = emulated_partials<T>(
      b.g, kernels::BnGradTerms<T>{xs.p, dys.p, p.mean.data(), p.var.data(), p.scale.data(), p.bias.data(), relu});
  for (auto* v : {&b.dscale, &b.dbias, &b.mean_g, &b.mean_g_xhat}) v->assign(static_cast<size_t>(c), NAN);
  emulated::run_grid(
      static_cast<unsigned>(c), 1,
      [&] {
        cu::bn_grad_finalize(b.partials.first.data(), b.partials.second.data(), b.g.chunks, m, b.dscale.data(),
                             b.dbias.data(), b.mean_g.data(), b.mean_g_xhat.data());
      },
      cu::kBlock);
  b.grouped = emulated_channel_map<cu::kPackWidth<T>>(
      m, c,
      cu::BnGradMap<T>{xs.p, dys.p, dxs.p, p.mean.data(), p.var.data(), p.scale.data(), p.bias.data(), b.mean_g.data(),
                       b.mean_g_xhat.data(), c, relu});
  b.dx = dxs.values(n);
  return b;
}

// ---- the CPU's ops ---------------------------------------------------------------------

std::map<std::string, Attr> bn_attrs(Fusion fusion) {
  std::map<std::string, Attr> a{{"momentum", static_cast<double>(kMomentum)},
                                {"epsilon", static_cast<double>(kEps)},
                                {"data_layout", std::string("NHWC")}};
  if (fusion != Fusion::none) a["fuse_with_relu"] = true;
  return a;
}

Tensor f32(const std::vector<float>& v) { return Tensor::from_floats({static_cast<int64_t>(v.size())}, v); }

// The CPU's batch_norm forward: Y, MeanOut and VarianceOut (in place), SavedMean, SavedVariance.
std::map<std::string, Tensor> cpu_forward(const Tensor& x, const Tensor& z, const Params& p, Fusion fusion,
                                          bool training) {
  std::map<std::string, std::vector<std::string>> ins{
      {"X", {"x"}}, {"Scale", {"scale"}}, {"Bias", {"bias"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}};
  std::vector<std::pair<std::string, Tensor>> feeds{
      {"x", x}, {"scale", f32(p.scale)}, {"bias", f32(p.bias)}, {"mean", f32(p.mean)}, {"var", f32(p.var)}};
  if (fusion == Fusion::residual_relu) {
    ins["Z"] = {"z"};
    feeds.push_back({"z", z});
  }
  std::map<std::string, std::vector<std::string>> outs{{"Y", {"y"}}};
  std::vector<std::string> results{"y"};
  if (training) {
    outs.insert({{"MeanOut", {"mean"}},
                 {"VarianceOut", {"var"}},
                 {"SavedMean", {"saved_mean"}},
                 {"SavedVariance", {"saved_inv_std"}}});
    results.insert(results.end(), {"mean", "var", "saved_mean", "saved_inv_std"});
  }
  std::map<std::string, Attr> attrs = bn_attrs(fusion);
  if (!training) attrs["is_test"] = true;
  return run_ops_on({make_op("batch_norm", ins, outs, attrs)}, feeds, cpu_device(), ExecEnv{}, results);
}

// The CPU's batch_norm_grad: X@GRAD, Scale@GRAD, Bias@GRAD from the saved statistics in p.mean and p.var.
std::map<std::string, Tensor> cpu_backward(const Tensor& x, const Tensor& dy, const Params& p, bool relu) {
  return run_ops_on({make_op("batch_norm_grad",
                             {{"X", {"x"}},
                              {"Scale", {"scale"}},
                              {"Bias", {"bias"}},
                              {"SavedMean", {"saved_mean"}},
                              {"SavedVariance", {"saved_inv_std"}},
                              {"Y@GRAD", {"dy"}}},
                             {{"X@GRAD", {"dx"}}, {"Scale@GRAD", {"dscale"}}, {"Bias@GRAD", {"dbias"}}},
                             bn_attrs(relu ? Fusion::relu : Fusion::none))},
                    {{"x", x},
                     {"dy", dy},
                     {"scale", f32(p.scale)},
                     {"bias", f32(p.bias)},
                     {"saved_mean", f32(p.mean)},
                     {"saved_inv_std", f32(p.var)}},
                    cpu_device(), ExecEnv{}, {"dx", "dscale", "dbias"});
}

// ---- comparisons -----------------------------------------------------------------------

// The kernel's partial sums (of pass 1's `terms`) bit for bit against the
// host's; returns each channel's two totals, in double.
struct BnTotalsOnHost {
  std::vector<double> first, second;
};
template <typename T, typename Terms>
BnTotalsOnHost checked_totals(const BnSumGeometry& g, const BnPartials& got, const Terms& terms,
                              const std::string& what) {
  const BnPartials want =
      g.vec == 1 ? reference_bn_partials<1>(g, terms) : reference_bn_partials<cu::kPackWidth<T>>(g, terms);
  expect_same_bits(got.first, want.first, what + ": the first partial sums");
  expect_same_bits(got.second, want.second, what + ": the second partial sums");
  return {bn_channel_totals(g, got.first), bn_channel_totals(g, got.second)};
}

// |got - want| within `ulps` FP32 ulps of want, element for element.
void expect_within_ulps(const std::vector<float>& got, const std::vector<float>& want, int ulps,
                        const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  size_t outside = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float w = std::fabs(want[i]);
    const float ulp = std::nextafter(w, INFINITY) - w;
    outside += !(std::fabs(got[i] - want[i]) <= static_cast<float>(ulps) * ulp);
  }
  CHECK(outside == 0);
}

// Some of y is zero and some is not: relu blocked values and passed others, so the fused paths are not vacuous.
template <typename T>
void expect_relu_mixed(const std::vector<T>& y) {
  size_t zeros = 0;
  for (const T& v : y) zeros += to_float(v) == 0.f;
  CHECK(zeros > 0);
  CHECK(zeros < y.size());
}

template <typename T>
void check_exact_forward(DType dt) {
  for (const Case& k : kExactCases) {
    const std::string what = "training forward " + what_of(k, dt);
    INFO(what);
    const Tensor x = small_integers(k.shape, dt, 601);
    const Tensor z = random_tensor(k.shape, dt, 602, -1.f, 1.f);
    const Params p = params(channels(k), 603);
    const Stats st = emulated_train_stats<T>(k, x, p);
    CHECK(st.g.vec == (packs_x(k, cu::kPackWidth<T>) ? cu::kPackWidth<T> : 1));
    for (Fusion fusion : {Fusion::none, Fusion::relu, Fusion::residual_relu}) {
      const auto cpu = cpu_forward(x, z, p, fusion, true);
      if (fusion == Fusion::none) {  // the statistics do not depend on the fusion
        expect_same_bits(st.saved_mean, cpu.at("saved_mean").to_floats(), what + ": SavedMean");
        expect_same_bits(st.saved_inv_std, cpu.at("saved_inv_std").to_floats(), what + ": SavedVariance");
        expect_same_bits(st.mean_out, cpu.at("mean").to_floats(), what + ": MeanOut");
        expect_same_bits(st.var_out, cpu.at("var").to_floats(), what + ": VarianceOut");
      }
      const Normalized<T> got = emulated_normalize<T>(k, x, z, st.saved_mean, st.saved_inv_std, p, fusion);
      CHECK(got.grouped == normalize_packs(k, cu::kPackWidth<T>, fusion == Fusion::residual_relu));
      expect_same_bits(got.y, values_of<T>(cpu.at("y")), what + fusion_name(fusion) + ": Y");
      if (fusion != Fusion::none) expect_relu_mixed(got.y);
    }
  }
}

template <typename T>
void check_exact_backward(DType dt, bool relu) {
  for (const Case& k : kExactCases) {
    const std::string what = "backward " + what_of(k, dt) + (relu ? ", fuse_with_relu" : "");
    INFO(what);
    const Tensor x = small_integers(k.shape, dt, 611);
    const Tensor dy = small_integers(k.shape, dt, 612);
    Params p = params(channels(k), 613);
    // Saved statistics that keep xhat exact: means in halves, 1/std a power of two.
    for (size_t ch = 0; ch < p.mean.size(); ++ch) {
      p.mean[ch] = 0.5f * static_cast<float>(static_cast<int>(ch % 7) - 3);
      p.var[ch] = ch % 2 ? 0.5f : 0.25f;
    }
    const auto cpu = cpu_backward(x, dy, p, relu);
    const Backward<T> got = emulated_backward<T>(k, x, dy, p, relu);
    CHECK(got.g.vec == (packs_all(k, cu::kPackWidth<T>) ? cu::kPackWidth<T> : 1));
    CHECK(got.grouped == packs_all(k, cu::kPackWidth<T>));
    expect_same_bits(got.dscale, cpu.at("dscale").to_floats(), what + ": Scale@GRAD");
    expect_same_bits(got.dbias, cpu.at("dbias").to_floats(), what + ": Bias@GRAD");
    expect_same_bits(got.dx, values_of<T>(cpu.at("dx")), what + ": X@GRAD");
  }
}

// The forward's passes on random data, each against the host's rendering of it.
template <typename T>
void check_random_forward(DType dt) {
  for (const Case& k : kRandomCases) {
    const std::string what = "training forward " + what_of(k, dt) + ", random";
    INFO(what);
    const int64_t c = channels(k), m = rows(k);
    const Tensor x = random_tensor(k.shape, dt, 621, 2.f, 5.f);  // off-centre, as conv outputs are
    const Tensor z = random_tensor(k.shape, dt, 622, -1.f, 1.f);
    const Params p = params(c, 623);
    const Stats st = emulated_train_stats<T>(k, x, p);
    CHECK(st.g.vec == (packs_x(k, cu::kPackWidth<T>) ? cu::kPackWidth<T> : 1));
    const std::vector<T> xv = values_of<T>(x), zv = values_of<T>(z);

    // Sums of x - shift and of its square.
    const auto [s, q] = checked_totals<T>(st.g, st.partials, kernels::BnStatsTerms<T>{xv.data()}, what);
    std::vector<float> mean(static_cast<size_t>(c)), inv_std(mean.size()), mean_out(mean.size()), var_out(mean.size());
    for (size_t ch = 0; ch < mean.size(); ++ch) {
      const fn::BnBatchStats b = fn::bn_batch_stats(s[ch], q[ch], to_float(xv[ch]), m);
      mean[ch] = static_cast<float>(b.mean);
      inv_std[ch] = fn::bn_inv_std(static_cast<float>(b.var), kEps);
      mean_out[ch] = fn::bn_running_update(p.mean[ch], mean[ch], kMomentum);
      var_out[ch] = fn::bn_running_update(p.var[ch], static_cast<float>(fn::bn_unbiased_var(b.var, m)), kMomentum);
    }
    expect_within_ulps(st.saved_mean, mean, 1, what + ": SavedMean");
    expect_within_ulps(st.saved_inv_std, inv_std, 1, what + ": SavedVariance");
    expect_within_ulps(st.mean_out, mean_out, 1, what + ": MeanOut");
    expect_within_ulps(st.var_out, var_out, 1, what + ": VarianceOut");

    for (Fusion fusion : {Fusion::none, Fusion::relu, Fusion::residual_relu}) {
      std::vector<T> y(xv.size());
      for (size_t i = 0; i < y.size(); ++i) {
        const auto ch = static_cast<size_t>(static_cast<int64_t>(i) % c);
        const fn::BnNormalize f{st.saved_mean[ch], st.saved_inv_std[ch] * p.scale[ch], p.bias[ch]};
        const float xf = to_float(xv[i]);
        y[i] = from_float<T>(fusion == Fusion::residual_relu ? fn::BnAddRelu<T>{f}(xf, to_float(zv[i]))
                                                             : fn::BnNormalizeAct{f, fusion != Fusion::none}(xf));
      }
      const Normalized<T> got = emulated_normalize<T>(k, x, z, st.saved_mean, st.saved_inv_std, p, fusion);
      CHECK(got.grouped == normalize_packs(k, cu::kPackWidth<T>, fusion == Fusion::residual_relu));
      expect_same_bits(got.y, y, what + fusion_name(fusion) + ": Y from its statistics");
    }
  }
}

template <typename T>
void check_random_backward(DType dt, bool relu) {
  for (const Case& k : kRandomCases) {
    const std::string what = "backward " + what_of(k, dt) + (relu ? ", fuse_with_relu" : "") + ", random";
    INFO(what);
    const int64_t c = channels(k), m = rows(k);
    const Tensor x = random_tensor(k.shape, dt, 631, 2.f, 5.f);
    const Tensor dy = random_tensor(k.shape, dt, 632, -1.f, 1.f);
    Params p = params(c, 633);
    for (float& mean : p.mean) mean += 3.5f;  // near X's mean, so that relu's mask passes some values
    const Backward<T> got = emulated_backward<T>(k, x, dy, p, relu);
    CHECK(got.g.vec == (packs_all(k, cu::kPackWidth<T>) ? cu::kPackWidth<T> : 1));
    CHECK(got.grouped == packs_all(k, cu::kPackWidth<T>));
    const std::vector<T> xv = values_of<T>(x), dyv = values_of<T>(dy);
    const kernels::BnGradTerms<T> terms{xv.data(),      dyv.data(),    p.mean.data(), p.var.data(),
                                        p.scale.data(), p.bias.data(), relu};
    const auto [s, sx] = checked_totals<T>(got.g, got.partials, terms, what);  // sums of g and of g xhat
    std::vector<float> dscale(static_cast<size_t>(c)), dbias(dscale.size()), mean_g(dscale.size()),
        mean_g_xhat(dscale.size());
    for (size_t ch = 0; ch < dscale.size(); ++ch) {
      dscale[ch] = static_cast<float>(sx[ch]);
      dbias[ch] = static_cast<float>(s[ch]);
      mean_g[ch] = static_cast<float>(s[ch] / static_cast<double>(m));
      mean_g_xhat[ch] = static_cast<float>(sx[ch] / static_cast<double>(m));
    }
    expect_within_ulps(got.dscale, dscale, 1, what + ": Scale@GRAD");
    expect_within_ulps(got.dbias, dbias, 1, what + ": Bias@GRAD");
    expect_within_ulps(got.mean_g, mean_g, 1, what + ": mean of g");
    expect_within_ulps(got.mean_g_xhat, mean_g_xhat, 1, what + ": mean of g xhat");

    std::vector<T> dx(xv.size());
    size_t blocked = 0;
    for (size_t i = 0; i < dx.size(); ++i) {
      const auto ch = static_cast<size_t>(static_cast<int64_t>(i) % c);
      const fn::BnReluGradFromX<T> mask{{p.mean[ch], p.var[ch] * p.scale[ch], p.bias[ch]}};
      const fn::BnBackward back{p.mean[ch], p.var[ch], p.scale[ch] * p.var[ch], got.mean_g[ch], got.mean_g_xhat[ch]};
      const float xf = to_float(xv[i]), g = relu ? mask(xf, to_float(dyv[i])) : to_float(dyv[i]);
      blocked += relu && g == 0.f;
      dx[i] = from_float<T>(back(xf, g));
    }
    if (relu) CHECK(blocked > 0);
    if (relu) CHECK(blocked < dx.size());
    expect_same_bits(got.dx, dx, what + ": X@GRAD from its means");
  }
}

}  // namespace

TEST_CASE("emulated channels-last batch_norm forward gives the CPU's bits on exact data", "[emulated][batch_norm]") {
  check_exact_forward<float>(DType::f32);
  check_exact_forward<half_t>(DType::f16);
  check_exact_forward<bf16_t>(DType::bf16);
}

TEST_CASE("emulated channels-last batch_norm backward gives the CPU's bits on exact data", "[emulated][batch_norm]") {
  for (bool relu : {false, true}) {
    check_exact_backward<float>(DType::f32, relu);
    check_exact_backward<half_t>(DType::f16, relu);
    check_exact_backward<bf16_t>(DType::bf16, relu);
  }
}

TEST_CASE("emulated channels-last batch_norm passes match the host's on random data", "[emulated][batch_norm]") {
  check_random_forward<float>(DType::f32);
  check_random_forward<half_t>(DType::f16);
  check_random_forward<bf16_t>(DType::bf16);
  for (bool relu : {false, true}) {
    check_random_backward<float>(DType::f32, relu);
    check_random_backward<half_t>(DType::f16, relu);
    check_random_backward<bf16_t>(DType::bf16, relu);
  }
}

TEST_CASE("emulated batch_norm finalize adds more chunks than its block has threads", "[emulated][batch_norm]") {
  // 3 channels of 600 chunks: each thread of the block adds two or three
  // partials before the tree. Integer partials, so every order gives the same sums.
  constexpr int64_t c = 3, chunks = 600, m = 1 << 20;
  std::vector<float> first(static_cast<size_t>(c * chunks)), second(first.size());
  for (size_t i = 0; i < first.size(); ++i) {
    first[i] = static_cast<float>(static_cast<int64_t>(i * 37 % 101) - 50);
    second[i] = static_cast<float>(i * 53 % 211);
  }
  std::vector<double> s(c, 0.0), q(c, 0.0);
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t k = 0; k < chunks; ++k) {
      s[static_cast<size_t>(ch)] += first[static_cast<size_t>(ch * chunks + k)];
      q[static_cast<size_t>(ch)] += second[static_cast<size_t>(ch * chunks + k)];
    }

  std::vector<float> dscale(c, NAN), dbias(c, NAN), mean_g(c, NAN), mean_g_xhat(c, NAN);
  emulated::run_grid(
      c, 1,
      [&] {
        cu::bn_grad_finalize(first.data(), second.data(), chunks, m, dscale.data(), dbias.data(), mean_g.data(),
                             mean_g_xhat.data());
      },
      cu::kBlock);
  const std::vector<float> x{1.5f, -2.f, 0.25f};  // row 0 of X: the shifts
  std::vector<float> running_mean(c, 0.5f), running_var(c, 2.f), mean_out(c, NAN), var_out(c, NAN), saved_mean(c, NAN),
      saved_inv_std(c, NAN);
  emulated::run_grid(
      c, 1,
      [&] {
        cu::bn_stats_finalize<float>(x.data(), first.data(), second.data(), chunks, m, running_mean.data(),
                                     running_var.data(), kMomentum, kEps, mean_out.data(), var_out.data(),
                                     saved_mean.data(), saved_inv_std.data());
      },
      cu::kBlock);
  for (size_t ch = 0; ch < static_cast<size_t>(c); ++ch) {
    INFO("channel " << ch);
    CHECK(dscale[ch] == static_cast<float>(q[ch]));
    CHECK(dbias[ch] == static_cast<float>(s[ch]));
    CHECK(mean_g[ch] == static_cast<float>(s[ch] / m));
    CHECK(mean_g_xhat[ch] == static_cast<float>(q[ch] / m));
    const fn::BnBatchStats st = fn::bn_batch_stats(s[ch], q[ch], x[ch], m);
    CHECK(saved_mean[ch] == static_cast<float>(st.mean));
    CHECK(saved_inv_std[ch] == fn::bn_inv_std(static_cast<float>(st.var), kEps));
    CHECK(mean_out[ch] == fn::bn_running_update(0.5f, static_cast<float>(st.mean), kMomentum));
    CHECK(var_out[ch] == fn::bn_running_update(2.f, static_cast<float>(fn::bn_unbiased_var(st.var, m)), kMomentum));
  }
}

TEST_CASE("emulated channels-last batch_norm evaluation gives the CPU's bits", "[emulated][batch_norm]") {
  auto check = [](auto tag, DType dt) {
    using T = decltype(tag);
    for (const Case& k : kRandomCases)
      for (Fusion fusion : {Fusion::none, Fusion::relu, Fusion::residual_relu}) {
        const std::string what = "evaluation " + what_of(k, dt) + fusion_name(fusion);
        INFO(what);
        const int64_t c = channels(k);
        const Tensor x = random_tensor(k.shape, dt, 641, -2.f, 2.f);
        const Tensor z = random_tensor(k.shape, dt, 642, -1.f, 1.f);
        const Params p = params(c, 643);
        std::vector<float> inv_std(static_cast<size_t>(c), NAN);
        emulated_grid_stride(c, cu::BnRunningInvStd{p.var.data(), kEps, inv_std.data()});
        const Normalized<T> got = emulated_normalize<T>(k, x, z, p.mean, inv_std, p, fusion);
        CHECK(got.grouped == normalize_packs(k, cu::kPackWidth<T>, fusion == Fusion::residual_relu));
        expect_same_bits(got.y, values_of<T>(cpu_forward(x, z, p, fusion, false).at("y")), what + ": Y");
      }
  };
  check(float{}, DType::f32);
  check(half_t{}, DType::f16);
  check(bf16_t{}, DType::bf16);
}
