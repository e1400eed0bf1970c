#pragma once
// What batch_norm's channels-last partial-sum kernel (bn_chunk_partials,
// runtime/ops/cuda/batch_norm_channels_last_kernels.cuh) writes, computed on
// the host block by block and thread by thread through the functions it calls
// (runtime/kernels/bn_channel_sums.h), with the block's row-lane sums gathered
// as the kernel gathers them in shared memory. test_bn_channel_sums checks the
// split with it; test_bn_channels_last_kernels_emulated checks the kernel's
// own block of threads and shared memory against it.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "runtime/kernels/bn_channel_sums.h"

namespace mix::testing {

/// The two sums of each (channel, chunk), at kernels::bn_partial_index ([c, chunks]).
struct BnPartials {
  std::vector<float> first, second;
};

template <int V, typename Terms>
BnPartials reference_bn_partials(const kernels::BnSumGeometry& g, const Terms& terms) {
  BnPartials out{std::vector<float>(static_cast<size_t>(g.c * g.chunks), NAN),
                 std::vector<float>(static_cast<size_t>(g.c * g.chunks), NAN)};
  std::vector<float> lane_a(kernels::kBnSumThreads * V), lane_b(lane_a.size());
  for (int64_t tile = 0; tile < g.tiles; ++tile)
    for (int64_t chunk = 0; chunk < g.chunks; ++chunk) {
      for (int t = 0; t < kernels::kBnSumThreads; ++t) {
        const int lane = t % g.lanes, row_lane = t / g.lanes;
        float a[V], b[V];
        kernels::bn_thread_sums<V>(g, terms, tile, chunk, lane, row_lane, a, b);
        for (int k = 0; k < V; ++k) {
          lane_a[static_cast<size_t>((row_lane * g.lanes + lane) * V + k)] = a[k];
          lane_b[static_cast<size_t>((row_lane * g.lanes + lane) * V + k)] = b[k];
        }
      }
      for (int lane = 0; lane < g.lanes; ++lane) {
        const int64_t group = tile * g.lanes + lane;
        if (group >= g.groups()) continue;
        for (int k = 0; k < V; ++k) {
          const auto at = static_cast<size_t>(kernels::bn_partial_index(g, group * V + k, chunk));
          REQUIRE(std::isnan(out.first[at]));  // written once
          out.first[at] = kernels::bn_sum_row_lanes<V>(g, lane_a.data(), lane, k);
          out.second[at] = kernels::bn_sum_row_lanes<V>(g, lane_b.data(), lane, k);
        }
      }
    }
  return out;
}

/// Each channel's total over its chunks, in double, in chunk order.
inline std::vector<double> bn_channel_totals(const kernels::BnSumGeometry& g, const std::vector<float>& partial) {
  std::vector<double> t(static_cast<size_t>(g.c), 0.0);
  for (int64_t ch = 0; ch < g.c; ++ch)
    for (int64_t chunk = 0; chunk < g.chunks; ++chunk)
      t[static_cast<size_t>(ch)] += partial[static_cast<size_t>(kernels::bn_partial_index(g, ch, chunk))];
  return t;
}

}  // namespace mix::testing
