#pragma once
// The FP32 kernels of fused_attention.cu and what they share (that file's
// header comment says what they compute and how), in a header of their own
// so that tests/unit/test_attention_fp32_kernels_emulated.cc can run this
// same code on the CPU. Before including it, the includer provides CUDA's
// warp and block primitives (nvcc, or tests/unit/cuda_emulation.h), and after
// it defines dynamic_shared_floats(); kWarp, warp_reduce, AddRn and MaxOf
// come from row_group.cuh. Everything here is in an unnamed namespace: each
// includer has its own copy (the CUDA kernels, or the emulation's plain
// functions of the same names), never one for both.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "runtime/core/half.h"
#include "runtime/kernels/attention_row.h"
#include "runtime/ops/cuda/kernel_unroll.h"
#include "runtime/ops/cuda/row_group.cuh"
#include "runtime/ops/fused_attention_shapes.h"

namespace mix::cuda {
namespace {

using attention_rules::AttentionDims;

/// The block's dynamic shared memory as floats (the includer's: extern
/// __shared__ on the GPU).
__device__ float* dynamic_shared_floats();

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarp;
constexpr int kRowsPerWarp = 4;
constexpr int kBlockRows = kWarps * kRowsPerWarp;  // query (or key) rows per block
constexpr int kTile = kWarp;                       // rows of the other side per shared tile: a row per lane
constexpr int64_t kMaxHeadDim = 256;               // 8 values per lane
constexpr unsigned kFullMask = 0xffffffffu;

// ---- tiles in shared memory --------------------------------------------------------------

// Floats of dynamic shared memory each kernel's launch gives it, for head dim
// d: the layouts at the top of the kernels below. fused_attention.cu launches
// with them, and the emulated test holds the kernels to them.
constexpr int64_t forward_shared_floats(int64_t d) { return kBlockRows * d + kTile * (d + 1) + kTile * d; }
constexpr int64_t grad_kv_shared_floats(int64_t d) { return 2 * kBlockRows * d + 2 * kTile * (d + 1) + 2 * kTile; }
constexpr int64_t grad_q_shared_floats(int64_t d) { return 2 * kBlockRows * d + 2 * kTile * (d + 1); }

// rows [first, first + count) of a [total, d] tensor into a [count][stride]
// FP32 tile (stride d or d + 1), zeros past `total`.
template <typename T>
__device__ void load_tile(const T* src, int64_t first, int64_t count, int64_t total, int64_t d, int64_t stride,
                          float* tile) {
  for (int64_t idx = threadIdx.x; idx < count * d; idx += kThreads) {
    const int64_t r = idx / d, c = idx % d, row = first + r;
    tile[r * stride + c] = row < total ? to_float(src[row * d + c]) : 0.f;
  }
}

// a . b over d FP32 values, in column order.
__device__ __forceinline__ float dot(const float* a, const float* b, int64_t d) {
  float s = 0.f;
  for (int64_t c = 0; c < d; ++c) s += a[c] * b[c];
  return s;
}

// ---- a warp's rows in registers ------------------------------------------------------------

// kRowsPerWarp rows of d values, of which this lane holds columns lane, lane + 32, ...
template <int kChunks>
using WarpRows = float[kRowsPerWarp][kChunks];

template <int kChunks>
__device__ __forceinline__ void zero_rows(WarpRows<kChunks>& rows) {
  MIX_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) MIX_UNROLL
  for (int ch = 0; ch < kChunks; ++ch) rows[rr][ch] = 0.f;
}

// Stores a warp's rows, row rr as dst row first + rr (rows past `total`
// skipped), each value as value(rr, accumulated) rounded to T: the one
// rounding of every output.
template <typename T, int kChunks, typename Value>
__device__ __forceinline__ void store_rows(const WarpRows<kChunks>& rows, T* dst, int64_t first, int64_t total,
                                           int64_t d, Value value) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  MIX_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    if (first + rr >= total) break;
    MIX_UNROLL
    for (int ch = 0; ch < kChunks; ++ch) {
      const int64_t c = lane + ch * kWarp;
      if (c < d) dst[(first + rr) * d + c] = from_float<T>(value(rr, rows[rr][ch]));
    }
  }
}

// row += sum_j weight_j * tile row j over the tile's first `count` rows (of
// `stride` floats), where lane j holds weight_j: a shuffle hands each lane
// every weight in turn, and each lane adds into its own columns.
template <int kChunks>
__device__ __forceinline__ void add_weighted_rows(float (&row)[kChunks], float weight, const float* tile,
                                                  int64_t stride, int64_t count, int64_t d) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  for (int j = 0; j < count; ++j) {
    const float w = __shfl_sync(kFullMask, weight, j);
    MIX_UNROLL
    for (int ch = 0; ch < kChunks; ++ch) {
      const int64_t c = lane + ch * kWarp;
      if (c < d) row[ch] += w * tile[j * stride + c];
    }
  }
}

// The key-tile loop of the kernels that own a block of queries [first, first +
// kBlockRows): for each tile of kTile keys that the block's last query sees
// (under causal, later tiles are skipped), load_keys(k0) fills shared memory
// between two barriers, then body(rr, i, n, k0) runs for each query row i =
// first + warp * kRowsPerWarp + rr of this warp that sees a key of the tile (n:
// the keys row i sees). Rows and tiles are the same for every lane of a warp,
// so the body may shuffle.
template <typename LoadKeys, typename Body>
__device__ __forceinline__ void over_key_tiles(const AttentionDims& a, int64_t first, LoadKeys load_keys, Body body) {
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int64_t last = std::min<int64_t>(first + kBlockRows, a.t_q) - 1;
  const int64_t key_end = fn::attention_visible_keys(last, a.t_q, a.t_k, a.causal);
  for (int64_t k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();  // the previous tile's readers are done (and, the first time, the query tiles are written)
    load_keys(k0);
    __syncthreads();
    MIX_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t i = first + warp * kRowsPerWarp + rr;
      if (i >= a.t_q) break;
      const int64_t n = fn::attention_visible_keys(i, a.t_q, a.t_k, a.causal);
      if (k0 < n) body(rr, i, n, k0);
    }
  }
}

// ---- kernels -------------------------------------------------------------------------------

// Out and LSE of one block of queries (blockIdx.y) of one group (blockIdx.x).
template <typename T, int kChunks>
__global__ void __launch_bounds__(kThreads)
    attention_forward(const T* q, const T* k, const T* v, T* out, float* lse, AttentionDims a) {
  float* shared = dynamic_shared_floats();
  const int64_t d = a.d, padded = d + 1;
  float* q_sh = shared;                 // [kBlockRows][d]
  float* k_sh = q_sh + kBlockRows * d;  // [kTile][d + 1]
  float* v_sh = k_sh + kTile * padded;  // [kTile][d]
  const int64_t g = blockIdx.x, first = static_cast<int64_t>(blockIdx.y) * kBlockRows;
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const T* kg = k + g * a.t_k * d;
  const T* vg = v + g * a.t_k * d;
  load_tile(q + g * a.t_q * d, first, kBlockRows, a.t_q, d, d, q_sh);

  float max[kRowsPerWarp], sum_exp[kRowsPerWarp];
  WarpRows<kChunks> acc;
  zero_rows(acc);
  MIX_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    max[rr] = -INFINITY;
    sum_exp[rr] = 0.f;
  }
  const auto load_keys = [&](int64_t k0) {
    load_tile(kg, k0, kTile, a.t_k, d, padded, k_sh);
    load_tile(vg, k0, kTile, a.t_k, d, d, v_sh);
  };
  over_key_tiles(a, first, load_keys, [&](int rr, int64_t i, int64_t n, int64_t k0) {
    const bool visible = k0 + lane < n;
    const float* q_row = q_sh + (i - first) * d;
    const float s = visible ? fn::attention_score(dot(q_row, k_sh + lane * padded, d), a.scale) : -INFINITY;
    const float new_max = fn::max_of(max[rr], warp_reduce(s, MaxOf{}));
    const float carry = fn::attention_rescale(max[rr], new_max);
    const float e = visible ? fn::exp_shifted(s, new_max) : 0.f;
    sum_exp[rr] = sum_exp[rr] * carry + warp_reduce(e, AddRn{});
    max[rr] = new_max;
    MIX_UNROLL
    for (int ch = 0; ch < kChunks; ++ch) acc[rr][ch] *= carry;
    add_weighted_rows(acc[rr], e, v_sh, d, std::min<int64_t>(kTile, n - k0), d);
  });
  const int64_t warp_first = first + warp * kRowsPerWarp;
  store_rows(acc, out + g * a.t_q * d, warp_first, a.t_q, d,
             [&](int rr, float weighted_sum) { return fn::attention_output(weighted_sum, sum_exp[rr]); });
  MIX_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr)
    if (lane == 0 && warp_first + rr < a.t_q)
      lse[g * a.t_q + warp_first + rr] = fn::attention_log_sum_exp(max[rr], sum_exp[rr]);
}

// delta[row] = dO_row . O_row over the rows of [rows, d], a warp per row.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_delta(const T* out, const T* dout, float* delta, int64_t rows, int64_t d) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / kWarp; r < rows; r += warps) {
    float s = 0.f;
    for (int64_t c = lane; c < d; c += kWarp) s += to_float(dout[r * d + c]) * to_float(out[r * d + c]);
    s = warp_reduce(s, AddRn{});
    if (lane == 0) delta[r] = s;
  }
}

// The probability and dS of query q_row (with its lse and delta) against key
// k_row (with its value v_row): p = exp(s - lse), dS = p (dO . v - delta).
struct ProbAndGrad {
  float p, ds;
};
__device__ __forceinline__ ProbAndGrad prob_and_grad(const float* q_row, const float* k_row, const float* do_row,
                                                     const float* v_row, float lse, float delta,
                                                     const AttentionDims& a) {
  const float p = fn::attention_prob(fn::attention_score(dot(q_row, k_row, a.d), a.scale), lse);
  return {p, fn::SoftmaxGradElem{delta}(p, dot(do_row, v_row, a.d))};
}

// dK and dV of one block of keys (blockIdx.y) of one group (blockIdx.x), over
// every query that sees them, 32 queries (a lane each) at a time.
template <typename T, int kChunks>
__global__ void __launch_bounds__(kThreads)
    attention_grad_kv(const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* delta, T* dk,
                      T* dv, AttentionDims a) {
  float* shared = dynamic_shared_floats();
  const int64_t d = a.d, padded = d + 1;
  float* k_sh = shared;                    // [kBlockRows][d]
  float* v_sh = k_sh + kBlockRows * d;     // [kBlockRows][d]
  float* q_sh = v_sh + kBlockRows * d;     // [kTile][d + 1]
  float* do_sh = q_sh + kTile * padded;    // [kTile][d + 1]
  float* lse_sh = do_sh + kTile * padded;  // [kTile]
  float* delta_sh = lse_sh + kTile;        // [kTile]
  const int64_t g = blockIdx.x, first = static_cast<int64_t>(blockIdx.y) * kBlockRows;
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const T* qg = q + g * a.t_q * d;
  const T* dog = dout + g * a.t_q * d;
  load_tile(k + g * a.t_k * d, first, kBlockRows, a.t_k, d, d, k_sh);
  load_tile(v + g * a.t_k * d, first, kBlockRows, a.t_k, d, d, v_sh);

  WarpRows<kChunks> dk_acc, dv_acc;
  zero_rows(dk_acc);
  zero_rows(dv_acc);
  // Under causal, key j is first seen by query j - (S - T).
  const int64_t query_begin = a.causal ? std::max<int64_t>(0, first - (a.t_k - a.t_q)) : 0;
  for (int64_t q0 = query_begin; q0 < a.t_q; q0 += kTile) {
    __syncthreads();
    load_tile(qg, q0, kTile, a.t_q, d, padded, q_sh);
    load_tile(dog, q0, kTile, a.t_q, d, padded, do_sh);
    if (threadIdx.x < kTile) {
      const int64_t i = q0 + threadIdx.x;
      lse_sh[threadIdx.x] = i < a.t_q ? lse[g * a.t_q + i] : 0.f;
      delta_sh[threadIdx.x] = i < a.t_q ? delta[g * a.t_q + i] : 0.f;
    }
    __syncthreads();
    const int64_t i = q0 + lane;  // this lane's query
    const int64_t n = i < a.t_q ? fn::attention_visible_keys(i, a.t_q, a.t_k, a.causal) : 0;
    const int queries_here = static_cast<int>(std::min<int64_t>(kTile, a.t_q - q0));
    MIX_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t r = warp * kRowsPerWarp + rr, j = first + r;
      if (j >= a.t_k) break;
      ProbAndGrad pg{0.f, 0.f};
      if (j < n)
        pg = prob_and_grad(q_sh + lane * padded, k_sh + r * d, do_sh + lane * padded, v_sh + r * d, lse_sh[lane],
                           delta_sh[lane], a);
      add_weighted_rows(dv_acc[rr], pg.p, do_sh, padded, queries_here, d);
      add_weighted_rows(dk_acc[rr], pg.ds, q_sh, padded, queries_here, d);
    }
  }
  const int64_t warp_first = first + warp * kRowsPerWarp;
  store_rows(dk_acc, dk + g * a.t_k * d, warp_first, a.t_k, d, [&](int, float sum) { return sum * a.scale; });
  store_rows(dv_acc, dv + g * a.t_k * d, warp_first, a.t_k, d, [](int, float sum) { return sum; });
}

// dQ of one block of queries (blockIdx.y) of one group (blockIdx.x), over the
// keys they see, 32 keys (a lane each) at a time.
template <typename T, int kChunks>
__global__ void __launch_bounds__(kThreads)
    attention_grad_q(const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* delta, T* dq,
                     AttentionDims a) {
  float* shared = dynamic_shared_floats();
  const int64_t d = a.d, padded = d + 1;
  float* q_sh = shared;                  // [kBlockRows][d]
  float* do_sh = q_sh + kBlockRows * d;  // [kBlockRows][d]
  float* k_sh = do_sh + kBlockRows * d;  // [kTile][d + 1]
  float* v_sh = k_sh + kTile * padded;   // [kTile][d + 1]
  const int64_t g = blockIdx.x, first = static_cast<int64_t>(blockIdx.y) * kBlockRows;
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const T* kg = k + g * a.t_k * d;
  const T* vg = v + g * a.t_k * d;
  load_tile(q + g * a.t_q * d, first, kBlockRows, a.t_q, d, d, q_sh);
  load_tile(dout + g * a.t_q * d, first, kBlockRows, a.t_q, d, d, do_sh);

  WarpRows<kChunks> dq_acc;
  zero_rows(dq_acc);
  const auto load_keys = [&](int64_t k0) {
    load_tile(kg, k0, kTile, a.t_k, d, padded, k_sh);
    load_tile(vg, k0, kTile, a.t_k, d, padded, v_sh);
  };
  over_key_tiles(a, first, load_keys, [&](int rr, int64_t i, int64_t n, int64_t k0) {
    const int64_t r = i - first;
    ProbAndGrad pg{0.f, 0.f};
    if (k0 + lane < n)
      pg = prob_and_grad(q_sh + r * d, k_sh + lane * padded, do_sh + r * d, v_sh + lane * padded, lse[g * a.t_q + i],
                         delta[g * a.t_q + i], a);
    add_weighted_rows(dq_acc[rr], pg.ds, k_sh, padded, std::min<int64_t>(kTile, n - k0), d);
  });
  store_rows(dq_acc, dq + g * a.t_q * d, first + warp * kRowsPerWarp, a.t_q, d,
             [&](int, float sum) { return sum * a.scale; });
}

// f(std::integral_constant<int, kChunks>{}): values per lane for head_dim d (the
// launchers' dispatch).
template <typename F>
void with_head_chunks(int64_t d, F&& f) {
  if (d <= 32)
    f(std::integral_constant<int, 1>{});
  else if (d <= 64)
    f(std::integral_constant<int, 2>{});
  else if (d <= 128)
    f(std::integral_constant<int, 4>{});
  else
    f(std::integral_constant<int, 8>{});
}

}  // namespace
}  // namespace mix::cuda
