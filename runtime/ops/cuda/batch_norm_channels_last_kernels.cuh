#pragma once
// The kernels of batch_norm's channels-last path, and the launch shapes the
// host picks for them (batch_norm_channels_last.cuh says what each pass
// computes; batch_norm_channels_last.cu launches them). Like row_group.cuh
// this header needs no CUDA header, so
// tests/unit/test_bn_channels_last_kernels_emulated.cc runs this same source
// on the CPU.
//
// Launch shapes. The sums (passes 1) split X as runtime/kernels/bn_channel_sums.h
// says (blocks of 256 threads over tiles of channel groups and chunks of
// about 16 rows a thread; 16-byte loads when C is a multiple of the pack
// width), the thread's share written there for host and device. The chunks'
// partial sums are added per channel in double by one block (passes 2). The
// elementwise passes 3, when C is a multiple of the pack width V, give each
// thread one group of V adjacent channels for all its rows (adjacent threads
// on adjacent groups of a row: 16-byte loads, a warp reading 512 contiguous
// bytes), so it loads that group's per-channel values into registers once
// instead of with every element; otherwise one element per thread, its
// channel found by a division.
#include <algorithm>
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/cuda/map_kernels.cuh"
#include "runtime/kernels/bn_channel_sums.h"
#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/column_sums.cuh"
#include "runtime/ops/cuda/kernel_unroll.h"
#include "runtime/ops/cuda/row_group.cuh"

namespace mix::cuda {

/// Whether the partial sums can read X (and dY, where not null) in packs of
/// kPackWidth<T> channels: C a multiple of the width, the arrays aligned.
template <typename T>
bool bn_sums_packed(int64_t c, const T* x, const T* dy) {
  constexpr int V = kPackWidth<T>;
  return c % V == 0 && pack_aligned(x, V) && (!dy || pack_aligned(dy, V));
}

/// Pass 1 of both directions (Terms: kernels::BnStatsTerms, BnGradTerms), a
/// grid of (g.tiles, g.chunks) blocks of kBnSumThreads: each thread's sums
/// (kernels::bn_thread_sums), then each channel's over the block's row lanes
/// in order, into first and second at [ch, chunk].
template <int V, typename Terms>
__global__ void __launch_bounds__(kernels::kBnSumThreads)
    bn_chunk_partials(kernels::BnSumGeometry g, Terms terms, float* first, float* second) {
  __shared__ float lane_a[kernels::kBnSumThreads * V], lane_b[kernels::kBnSumThreads * V];
  const int lane = static_cast<int>(threadIdx.x) % g.lanes, row_lane = static_cast<int>(threadIdx.x) / g.lanes;
  float a[V], b[V];
  kernels::bn_thread_sums<V>(g, terms, blockIdx.x, blockIdx.y, lane, row_lane, a, b);
  for (int k = 0; k < V; ++k) {
    lane_a[(row_lane * g.lanes + lane) * V + k] = a[k];
    lane_b[(row_lane * g.lanes + lane) * V + k] = b[k];
  }
  __syncthreads();
  const int64_t group = static_cast<int64_t>(blockIdx.x) * g.lanes + lane;
  if (row_lane != 0 || group >= g.groups()) return;
  for (int k = 0; k < V; ++k) {
    const int64_t at = kernels::bn_partial_index(g, group * V + k, blockIdx.y);
    first[at] = kernels::bn_sum_row_lanes<V>(g, lane_a, lane, k);
    second[at] = kernels::bn_sum_row_lanes<V>(g, lane_b, lane, k);
  }
}

/// The chunks' partial sums of channel blockIdx.x in double (fixed tree).
/// All threads of the block call it and get the total.
__device__ inline double bn_channel_total(const float* partial, int64_t chunks, double* shared) {
  const float* row = partial + static_cast<int64_t>(blockIdx.x) * chunks;
  double s = 0.0;
  for (int64_t k = threadIdx.x; k < chunks; k += kBlock) s = __dadd_rn(s, static_cast<double>(row[k]));
  return block_reduce(s, shared, AddRnDouble{});
}

/// Both of pass 1's sums of channel blockIdx.x, totalled as bn_channel_total does.
struct BnTotals {
  double first, second;
};
__device__ inline BnTotals bn_channel_totals(const float* first, const float* second, int64_t chunks) {
  __shared__ double shared[kBlock / kWarp];
  const double a = bn_channel_total(first, chunks, shared);
  return {a, bn_channel_total(second, chunks, shared)};
}

/// Forward pass 2, one block of kBlock threads per channel: the statistics
/// from the sums of x - shift (shift: the channel's value in row 0, as
/// kernels::BnStatsTerms takes it).
template <typename T>
__global__ void bn_stats_finalize(const T* x, const float* sum, const float* sum_sq, int64_t chunks, int64_t m,
                                  const float* running_mean, const float* running_var, float momentum, float eps,
                                  float* mean_out, float* var_out, float* saved_mean, float* saved_inv_std) {
  const BnTotals t = bn_channel_totals(sum, sum_sq, chunks);
  if (threadIdx.x != 0) return;
  const int64_t ch = blockIdx.x;
  const fn::BnBatchStats st = fn::bn_batch_stats(t.first, t.second, static_cast<double>(to_float(x[ch])), m);
  const float running_m = running_mean[ch], running_v = running_var[ch];  // read first: outputs may alias
  saved_mean[ch] = static_cast<float>(st.mean);
  saved_inv_std[ch] = fn::bn_inv_std(static_cast<float>(st.var), eps);
  mean_out[ch] = fn::bn_running_update(running_m, static_cast<float>(st.mean), momentum);
  var_out[ch] = fn::bn_running_update(running_v, static_cast<float>(fn::bn_unbiased_var(st.var, m)), momentum);
}

/// Backward pass 2, one block of kBlock threads per channel: the parameter
/// gradients and the means of g and g xhat (mean_g, mean_g_xhat: [c] each).
__global__ inline void bn_grad_finalize(const float* sum_g, const float* sum_g_xhat, int64_t chunks, int64_t m,
                                        float* dscale, float* dbias, float* mean_g, float* mean_g_xhat) {
  const BnTotals t = bn_channel_totals(sum_g, sum_g_xhat, chunks);
  if (threadIdx.x != 0) return;
  const int64_t ch = blockIdx.x;
  dbias[ch] = static_cast<float>(t.first);
  dscale[ch] = static_cast<float>(t.second);
  mean_g[ch] = static_cast<float>(t.first / static_cast<double>(m));
  mean_g_xhat[ch] = static_cast<float>(t.second / static_cast<double>(m));
}

/// Evaluation: inv_std[ch] = 1 / sqrt(running_var + eps), once per channel (a map over C).
struct BnRunningInvStd {
  const float* running_var;
  float eps;
  float* inv_std;
  __device__ void operator()(int64_t ch) const { inv_std[ch] = fn::bn_inv_std(running_var[ch], eps); }
};

// ---- passes 3: the elementwise maps over X [rows, c] ------------------------------------

/// Blocks of the column-group maps: enough threads for every group of a row,
/// at most kBnMaxColumnBlocks (each thread then loops over rows; the bound
/// depends on nothing but this constant) unless one row's groups need more.
inline constexpr int64_t kBnMaxColumnBlocks = 2048;
inline int64_t bn_column_group_blocks(int64_t rows, int64_t groups) {
  const int64_t row_blocks = (groups + kMapThreads - 1) / kMapThreads;
  return std::clamp<int64_t>((rows * groups + kMapThreads - 1) / kMapThreads, row_blocks,
                             std::max<int64_t>(kBnMaxColumnBlocks, row_blocks));
}

/// Whether a pass 3 map runs by column groups of V (else element by element).
template <int V, typename F>
bool bn_map_by_groups(int64_t c, const F& f) {
  return c % V == 0 && f.packable(V);
}

/// Runs f.column_rows<V>(col, first_row, row_step) on every thread that has
/// a column group: thread t takes group t % groups and rows t / groups,
/// t / groups + row_step, ... (row_step = the threads' count / groups).
template <int V, typename F>
__global__ void bn_column_group_kernel(int64_t rows, int64_t c, F f) {
  const int64_t groups = c / V;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t row_step = threads / groups;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= row_step * groups) return;
  f.template column_rows<V>((t % groups) * V, t / groups, row_step, rows);
}

/// Forward pass 3: y = relu?((x - mean) * (inv_std * scale) + bias), the CPU's functor.
template <typename T>
struct BnNormalizeMap {
  const T* x;
  const T* z;  // the residual added before relu (fn::BnAddRelu), or null
  T* y;
  const float *mean, *inv_std, *scale, *bias;
  int64_t c;
  bool relu;
  __device__ fn::BnNormalize channel(int64_t ch) const { return {mean[ch], inv_std[ch] * scale[ch], bias[ch]}; }
  __device__ float value(const fn::BnNormalize& f, float xv, float zv) const {
    return z ? fn::BnAddRelu<T>{f}(xv, zv) : fn::BnNormalizeAct{f, relu}(xv);
  }
  __device__ void operator()(int64_t i) const {
    y[i] = from_float<T>(value(channel(i % c), to_float(x[i]), z ? to_float(z[i]) : 0.f));
  }
  template <int V>
  __device__ void column_rows(int64_t col, int64_t first_row, int64_t row_step, int64_t rows) const {
    fn::BnNormalize f[V];
    MIX_UNROLL
    for (int k = 0; k < V; ++k) f[k] = channel(col + k);
    for (int64_t r = first_row; r < rows; r += row_step) {
      const Pack<T, V> xs = load_pack<V>(x, r * c + col);
      Pack<T, V> zs{};
      if (z) zs = load_pack<V>(z, r * c + col);
      Pack<T, V> out;
      MIX_UNROLL
      for (int k = 0; k < V; ++k) out.v[k] = from_float<T>(value(f[k], to_float(xs.v[k]), to_float(zs.v[k])));
      store_pack<V>(y, r * c + col, out);
    }
  }
  bool packable(int v) const { return pack_aligned(x, v) && pack_aligned(y, v) && (!z || pack_aligned(z, v)); }
};

/// Backward pass 3: dx = BnBackward(x, g), the CPU's functor.
template <typename T>
struct BnGradMap {
  const T* x;
  const T* dy;
  T* dx;
  const float *mean, *inv_std, *scale, *bias, *mean_g, *mean_g_xhat;  // bias: read only with relu
  int64_t c;
  bool relu;
  // One channel's two functors: relu's gradient (mask from x) and batch_norm's.
  struct Channel {
    fn::BnReluGradFromX<T> mask;
    fn::BnBackward back;
    bool relu;
    __device__ float operator()(float xv, float dyv) const { return back(xv, relu ? mask(xv, dyv) : dyv); }
  };
  __device__ Channel channel(int64_t ch) const {
    return {{{mean[ch], relu ? inv_std[ch] * scale[ch] : 0.f, relu ? bias[ch] : 0.f}},
            {mean[ch], inv_std[ch], scale[ch] * inv_std[ch], mean_g[ch], mean_g_xhat[ch]},
            relu};
  }
  __device__ void operator()(int64_t i) const {
    dx[i] = from_float<T>(channel(i % c)(to_float(x[i]), to_float(dy[i])));
  }
  template <int V>
  __device__ void column_rows(int64_t col, int64_t first_row, int64_t row_step, int64_t rows) const {
    Channel f[V];
    MIX_UNROLL
    for (int k = 0; k < V; ++k) f[k] = channel(col + k);
    for (int64_t r = first_row; r < rows; r += row_step) {
      const Pack<T, V> xs = load_pack<V>(x, r * c + col), dys = load_pack<V>(dy, r * c + col);
      Pack<T, V> out;
      MIX_UNROLL
      for (int k = 0; k < V; ++k) out.v[k] = from_float<T>(f[k](to_float(xs.v[k]), to_float(dys.v[k])));
      store_pack<V>(dx, r * c + col, out);
    }
  }
  bool packable(int v) const { return pack_aligned(x, v) && pack_aligned(dy, v) && pack_aligned(dx, v); }
};

}  // namespace mix::cuda
