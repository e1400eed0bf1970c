// The split of batch_norm's channels-last partial sums
// (runtime/kernels/bn_channel_sums.h) run on the CPU: every block and thread
// of a launch, one after another, through the same functions the kernel
// calls (bn_partials_reference.h). Counting terms check that every value of every channel
// is added exactly once, to its own chunk; the real forward and backward
// terms check the sums themselves against double.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/core/random.h"
#include "runtime/kernels/bn_channel_sums.h"
#include "runtime/kernels/functors.h"
#include "tests/unit/bn_partials_reference.h"

using namespace mix;
using kernels::BnSumGeometry;
using testing::bn_channel_totals;
using testing::BnPartials;
using testing::reference_bn_partials;

namespace {

// Terms (1, row of the value mod 1024): the chunk sums count the values and
// add their rows (mod 1024, so that a chunk's sum is exact in FP32).
struct CountingTerms {
  int64_t c;
  template <int V>
  struct Channels {
    int64_t c;
    void add(int64_t i, float (&a)[V], float (&b)[V]) const {
      for (int k = 0; k < V; ++k) {
        a[k] += 1.f;
        b[k] += static_cast<float>(i / c % 1024);
      }
    }
  };
  template <int V>
  Channels<V> channels(int64_t) const {
    return {c};
  }
};

template <int V>
void check_counts(int64_t rows, int64_t c) {
  const BnSumGeometry g = kernels::bn_sum_geometry(rows, c, V);
  INFO("rows " << rows << " c " << c << " vec " << V << ": lanes " << g.lanes << " row lanes " << g.row_lanes
               << " tiles " << g.tiles << " chunks " << g.chunks << " x " << g.rows_per_chunk);
  REQUIRE(g.lanes * g.row_lanes == kernels::kBnSumThreads);
  REQUIRE(g.tiles * g.lanes >= g.groups());
  REQUIRE(g.chunks * g.rows_per_chunk >= rows);
  const BnPartials p = reference_bn_partials<V>(g, CountingTerms{c});
  for (int64_t ch = 0; ch < c; ++ch) {
    double count = 0, row_sum = 0;
    for (int64_t chunk = 0; chunk < g.chunks; ++chunk) {
      const auto at = static_cast<size_t>(kernels::bn_partial_index(g, ch, chunk));
      REQUIRE(!std::isnan(p.first[at]));  // every (channel, chunk) written
      // The chunk's own rows, each once.
      const int64_t begin = chunk * g.rows_per_chunk;
      const int64_t end = std::min(rows, begin + g.rows_per_chunk);
      const int64_t n = std::max<int64_t>(0, end - begin);
      int64_t rows_mod = 0;
      for (int64_t r = begin; r < end; ++r) rows_mod += r % 1024;
      CHECK(p.first[at] == static_cast<float>(n));
      CHECK(p.second[at] == static_cast<float>(rows_mod));
      count += p.first[at];
      row_sum += p.second[at];
    }
    int64_t all_rows_mod = 0;
    for (int64_t r = 0; r < rows; ++r) all_rows_mod += r % 1024;
    CHECK(count == static_cast<double>(rows));
    CHECK(row_sum == static_cast<double>(all_rows_mod));
  }
}

std::vector<float> uniform(size_t n, uint64_t seed, float lo, float hi) {
  Rng rng = Rng::for_stream(seed, 1);
  std::vector<float> v(n);
  for (float& x : v) x = lo + (hi - lo) * static_cast<float>(rng.uniform());
  return v;
}

}  // namespace

TEST_CASE("each value of each channel is added once, to its chunk", "[bn_sums]") {
  // Packed (8 FP16 or 4 FP32 channels a thread) with one partial tile, several
  // full tiles and few channel groups; one channel a thread; chunks from one
  // to hundreds; fewer rows than row lanes.
  check_counts<8>(1000, 72);
  check_counts<8>(5, 24);
  check_counts<8>(3000, 2048);
  check_counts<8>(100000, 64);
  check_counts<4>(7000, 16);
  check_counts<1>(968, 6);
  check_counts<1>(1, 1);
  check_counts<1>(4000, 37);
}

TEST_CASE("the split stays within the GPU's grid limits", "[bn_sums]") {
  // ResNet-50's stem at batch 256, and a very large X: gridDim.y <= 65535.
  for (int64_t rows : {int64_t{256} * 112 * 112, int64_t{1} << 31})
    for (int vec : {1, 8}) {
      const BnSumGeometry g = kernels::bn_sum_geometry(rows, 64, vec);
      CHECK(g.chunks <= kernels::kBnMaxChunks);
      CHECK(g.chunks * g.rows_per_chunk >= rows);
    }
  // About kBnRowsPerThread rows a thread where the chunk count is not capped.
  const BnSumGeometry g = kernels::bn_sum_geometry(64 * 112 * 112, 64, 8);
  CHECK(g.lanes == 8);
  CHECK(g.rows_per_chunk / g.row_lanes <= kernels::kBnRowsPerThread);
}

TEST_CASE("the forward and backward terms sum to the channels' sums", "[bn_sums]") {
  constexpr int64_t rows = 3000, c = 40;
  const size_t n = static_cast<size_t>(rows * c);
  // X off-centre, as conv outputs are; FP16 storage (the sums read what is stored).
  std::vector<half_t> x(n), dy(n);
  const std::vector<float> xf = uniform(n, 1, 2.f, 5.f), dyf = uniform(n, 2, -1.f, 1.f);
  for (size_t i = 0; i < n; ++i) {
    x[i] = to_half(xf[i]);
    dy[i] = to_half(dyf[i]);
  }
  std::vector<float> mean(c), inv_std(c), scale(c), bias(c);
  for (int64_t ch = 0; ch < c; ++ch) {
    mean[static_cast<size_t>(ch)] = 3.5f;
    inv_std[static_cast<size_t>(ch)] = 1.1f;
    scale[static_cast<size_t>(ch)] = ch % 2 ? 0.9f : -0.6f;
    bias[static_cast<size_t>(ch)] = 0.1f * static_cast<float>(ch % 5) - 0.2f;
  }
  for (int vec : {1, 8}) {
    INFO("vec " << vec);
    const BnSumGeometry geo = kernels::bn_sum_geometry(rows, c, vec);
    const kernels::BnStatsTerms<half_t> stats{x.data()};
    const kernels::BnGradTerms<half_t> grads{x.data(),     dy.data(),   mean.data(), inv_std.data(),
                                             scale.data(), bias.data(), true};
    const BnPartials s = vec == 8 ? reference_bn_partials<8>(geo, stats) : reference_bn_partials<1>(geo, stats);
    const BnPartials gr = vec == 8 ? reference_bn_partials<8>(geo, grads) : reference_bn_partials<1>(geo, grads);
    const std::vector<double> sum = bn_channel_totals(geo, s.first), sum_sq = bn_channel_totals(geo, s.second);
    const std::vector<double> sum_g = bn_channel_totals(geo, gr.first), sum_g_xhat = bn_channel_totals(geo, gr.second);
    for (int64_t ch = 0; ch < c; ++ch) {
      const size_t k = static_cast<size_t>(ch);
      const double shift = to_float(x[k]);  // row 0's value
      double e_s = 0, e_q = 0, abs_v = 0, e_g = 0, e_gx = 0, abs_g = 0, abs_gx = 0;
      int64_t blocked = 0;
      // relu's gradient as the kernel applies it (its mask is tested elsewhere; here, the sums).
      const fn::BnReluGradFromX<half_t> mask{{mean[k], inv_std[k] * scale[k], bias[k]}};
      for (int64_t r = 0; r < rows; ++r) {
        const size_t i = static_cast<size_t>(r * c + ch);
        const double v = static_cast<double>(to_float(x[i])) - shift;
        e_s += v;
        e_q += v * v;
        abs_v += std::fabs(v);
        const double g = mask(to_float(x[i]), to_float(dy[i]));
        blocked += g == 0.0;
        const double xhat = (to_float(x[i]) - mean[k]) * inv_std[k];
        e_g += g;
        e_gx += g * xhat;
        abs_g += std::fabs(g);
        abs_gx += std::fabs(g * xhat);
      }
      INFO("channel " << ch);
      // Sums of n terms in FP32, whatever the order: (n + 2) u sum|terms|,
      // n the most terms one FP32 sum holds (a thread's rows, then its row lanes).
      const double u = 0x1p-24, terms = static_cast<double>(geo.rows_per_chunk + geo.row_lanes + 2);
      // The terms themselves round once (x - shift exact in FP32 here; v^2 and
      // g xhat's products up to 3 roundings): a few u of each term more.
      CHECK(std::fabs(sum[k] - e_s) <= terms * u * abs_v);
      CHECK(std::fabs(sum_sq[k] - e_q) <= (terms + 2) * u * e_q);
      CHECK(std::fabs(sum_g[k] - e_g) <= terms * u * abs_g);
      CHECK(std::fabs(sum_g_xhat[k] - e_gx) <= (terms + 4) * u * abs_gx);
      CHECK(blocked > 0);  // not vacuous: the mask blocked some gradients and passed others
      CHECK(blocked < rows);
    }
  }
}
