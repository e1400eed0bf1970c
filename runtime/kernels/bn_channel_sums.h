#pragma once
// The first pass of batch_norm's channels-last kernels
// (runtime/ops/cuda/batch_norm_channels_last.cu): per chunk of rows and per
// channel of X [rows, c], the sums of two terms of each value (forward: x -
// shift and its square; backward: g and g xhat). Written for host and device,
// so that which thread adds which values, in what order, runs on the CPU in
// tests/unit/test_bn_channel_sums.cc exactly as it does on the GPU; only the
// GPU's block of threads and its shared memory are the kernel's own.
//
// The split. A block has kBnSumThreads threads: `lanes` along the channels
// (adjacent lanes on adjacent groups of `vec` channels, so a warp reads a
// contiguous stretch of a row, 16 bytes a lane where vec > 1) and row_lanes =
// kBnSumThreads / lanes along the rows. blockIdx.x picks a tile of `lanes`
// channel groups, blockIdx.y a chunk of rows_per_chunk rows, which row lane
// r of the block strides through from the chunk's row r. Each thread keeps
// vec pairs of FP32 sums, its group's per-channel constants in registers;
// then the row lanes' sums of each channel are added in row-lane order.
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/kernels/functors.h"

namespace mix::kernels {

inline constexpr int kBnSumThreads = 256;
/// Rows each thread adds in a chunk, about: enough work per thread to hide
/// the loads' latency, few enough that ResNet-50's smaller layers still fill
/// the GPU with blocks.
inline constexpr int64_t kBnRowsPerThread = 16;
inline constexpr int64_t kBnMaxChunks = 8192;  // gridDim.y allows 65535

/// A rounded FP32 add the device compiler may not fuse with a product (as
/// device_ops.cuh's AddRn), so the sums round the same way at every call site.
MIX_HD float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
MIX_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MIX_HD float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

/// `vec` adjacent values of T, aligned so that they load as one (16 bytes at most).
template <typename T, int V>
struct alignas(sizeof(T) * V) ChannelPack {
  T v[V];
};

struct BnSumGeometry {
  int64_t rows = 0, c = 0;
  int vec = 1;                             // channels per thread: c % vec == 0
  int lanes = 1;                           // threads along channel groups (a power of two, at most 32)
  int row_lanes = 1;                       // kBnSumThreads / lanes
  int64_t tiles = 0;                       // blocks along the channels (gridDim.x)
  int64_t chunks = 0, rows_per_chunk = 0;  // blocks along the rows (gridDim.y)
  MIX_HD int64_t groups() const { return c / vec; }
};

/// The split of X [rows, c] into blocks, `vec` channels a thread (c % vec == 0).
inline BnSumGeometry bn_sum_geometry(int64_t rows, int64_t c, int vec) {
  BnSumGeometry g;
  g.rows = rows;
  g.c = c;
  g.vec = vec;
  const int64_t groups = c / vec;
  while (g.lanes < 32 && g.lanes < groups) g.lanes *= 2;
  g.row_lanes = kBnSumThreads / g.lanes;
  g.tiles = (groups + g.lanes - 1) / g.lanes;
  const int64_t target = static_cast<int64_t>(g.row_lanes) * kBnRowsPerThread;
  g.chunks = (rows + target - 1) / target;
  g.chunks = g.chunks < 1 ? 1 : (g.chunks > kBnMaxChunks ? kBnMaxChunks : g.chunks);
  g.rows_per_chunk = (rows + g.chunks - 1) / g.chunks;
  return g;
}

/// Thread (lane, row_lane) of block (tile, chunk): the sums a[k], b[k] of
/// the terms of channel group_first + k over its rows, in row order, where
/// Terms::Channels<V> (from terms.channels<V>(first channel)) adds the terms
/// of V adjacent channels at an element index. A thread past the last group
/// adds nothing (zeros).
template <int V, typename Terms>
MIX_HD void bn_thread_sums(const BnSumGeometry& g, const Terms& terms, int64_t tile, int64_t chunk, int lane,
                           int row_lane, float (&a)[V], float (&b)[V]) {
  for (int k = 0; k < V; ++k) a[k] = b[k] = 0.f;
  const int64_t group = tile * g.lanes + lane;
  if (group >= g.groups()) return;
  const int64_t ch = group * V;
  const int64_t begin = chunk * g.rows_per_chunk;
  const int64_t end = begin + g.rows_per_chunk < g.rows ? begin + g.rows_per_chunk : g.rows;
  const auto channels = terms.template channels<V>(ch);
  for (int64_t r = begin + row_lane; r < end; r += g.row_lanes) channels.add(r * g.c + ch, a, b);
}

/// The block's sum of channel (tile's group `lane`, + k) from every row lane's
/// sums, `lane_sums` holding them at [(row_lane * lanes + lane) * V + k], added
/// in row-lane order.
template <int V>
MIX_HD float bn_sum_row_lanes(const BnSumGeometry& g, const float* lane_sums, int lane, int k) {
  float s = 0.f;
  for (int r = 0; r < g.row_lanes; ++r) s = add_rn(s, lane_sums[(r * g.lanes + lane) * V + k]);
  return s;
}

/// Where a block's sum of channel ch goes: [c, chunks], a channel's chunks adjacent for the finalize.
MIX_HD int64_t bn_partial_index(const BnSumGeometry& g, int64_t ch, int64_t chunk) { return ch * g.chunks + chunk; }

/// The forward's terms: v = x - shift and v^2, shift = the channel's value in
/// row 0 (so the squares do not cancel against the mean's square,
/// fn::bn_batch_stats).
template <typename T>
struct BnStatsTerms {
  const T* x;
  template <int V>
  struct Channels {
    const T* x;
    float shift[V];
    MIX_HD void add(int64_t i, float (&a)[V], float (&b)[V]) const {
      const ChannelPack<T, V> p = *reinterpret_cast<const ChannelPack<T, V>*>(x + i);
      for (int k = 0; k < V; ++k) {
        const float v = sub_rn(to_float(p.v[k]), shift[k]);
        a[k] = add_rn(a[k], v);
        b[k] = add_rn(b[k], mul_rn(v, v));
      }
    }
  };
  template <int V>
  MIX_HD Channels<V> channels(int64_t ch) const {
    Channels<V> s{x, {}};
    for (int k = 0; k < V; ++k) s.shift[k] = to_float(x[ch + k]);
    return s;
  }
};

/// The backward's terms: g and g xhat, xhat = (x - mean) inv_std, g = dy
/// through relu's gradient with the mask recomputed from x when `relu`
/// (fn::BnReluGradFromX; Bias is read only then).
template <typename T>
struct BnGradTerms {
  const T *x, *dy;
  const float *mean, *inv_std, *scale, *bias;
  bool relu;
  template <int V>
  struct Channels {
    const T *x, *dy;
    float mean[V], inv_std[V];
    fn::BnReluGradFromX<T> mask[V];
    bool relu;
    MIX_HD void add(int64_t i, float (&a)[V], float (&b)[V]) const {
      const ChannelPack<T, V> xs = *reinterpret_cast<const ChannelPack<T, V>*>(x + i);
      const ChannelPack<T, V> dys = *reinterpret_cast<const ChannelPack<T, V>*>(dy + i);
      for (int k = 0; k < V; ++k) {
        const float xv = to_float(xs.v[k]), dyv = to_float(dys.v[k]);
        const float g = relu ? mask[k](xv, dyv) : dyv;
        a[k] = add_rn(a[k], g);
        b[k] = add_rn(b[k], mul_rn(g, mul_rn(sub_rn(xv, mean[k]), inv_std[k])));
      }
    }
  };
  template <int V>
  MIX_HD Channels<V> channels(int64_t ch) const {
    Channels<V> s{x, dy, {}, {}, {}, relu};
    for (int k = 0; k < V; ++k) {
      s.mean[k] = mean[ch + k];
      s.inv_std[k] = inv_std[ch + k];
      s.mask[k] = {{mean[ch + k], relu ? inv_std[ch + k] * scale[ch + k] : 0.f, relu ? bias[ch + k] : 0.f}};
    }
    return s;
  }
};

}  // namespace mix::kernels
