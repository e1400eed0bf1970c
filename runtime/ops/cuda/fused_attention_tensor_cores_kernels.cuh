#pragma once
// The kernels of fused_attention_tensor_cores.cu and what they share (that
// file's header comment says what they compute and how), in a header of
// their own so that tests/unit/test_attention_tensor_cores_emulated.cc can run
// this same code on the CPU. Before including it, the includer provides
// nvcuda::wmma (<mma.h>), __half and __nv_bfloat16 (<cuda_fp16.h>,
// <cuda_bf16.h>), uint4 and the warp and block primitives (CUDA's own, or the
// emulation's), and after it defines dynamic_shared(). Everything here is in
// an unnamed namespace: each includer has its own copy (the CUDA kernels, or
// the emulation's plain functions of the same names), never one for both.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "runtime/core/half.h"
#include "runtime/kernels/attention_row.h"
#include "runtime/kernels/softmax_row.h"
#include "runtime/ops/cuda/kernel_unroll.h"
#include "runtime/ops/fused_attention_shapes.h"

namespace mix::cuda::attention_tensor_cores {
namespace {

using attention_rules::AttentionDims;
namespace wmma = nvcuda::wmma;

/// The block's dynamic shared memory, 128-byte aligned (the includer's:
/// extern __shared__ on the GPU).
__device__ unsigned char* dynamic_shared();

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kFrag = 16;              // WMMA's m, n and k
constexpr int kRows = kWarps * kFrag;  // the block's own rows
constexpr int kCols = 64;              // rows of the other side per tile
constexpr unsigned kFullMask = 0xffffffffu;

// Row strides in elements, padded so that WMMA's loads of successive rows
// start in other banks; every section stays 32-byte aligned, as WMMA's loads
// and stores need (D is a multiple of 16).
template <int kD>
struct Strides {
  static constexpr int head = kD + 8;      // a row of D 16-bit values (Q, K, V, dO tiles)
  static constexpr int score = kCols + 4;  // a row of a tile's FP32 scores
  static constexpr int prob = kCols + 8;   // a row of a tile's 16-bit P or dS
  static constexpr int out = kD + 4;       // a row of D FP32 sums
  // Bytes of shared memory: 16-bit tiles, then each warp's FP32 buffers
  // (the forward: scores and output sums; the backward: two of scores, also
  // the scratch its sums are stored through), then each warp's 16-bit P or dS.
  static constexpr size_t tiles(int rows) { return static_cast<size_t>(rows) * head * 2; }
  static constexpr size_t forward_floats() { return static_cast<size_t>(kWarps) * kFrag * (score + out) * 4; }
  static constexpr size_t backward_floats() { return static_cast<size_t>(kWarps) * 2 * kFrag * score * 4; }
  static constexpr size_t warp_probs(int buffers) { return static_cast<size_t>(kWarps) * buffers * kFrag * prob * 2; }
  static_assert(kFrag * out <= 2 * kFrag * score, "a backward warp's two score buffers hold its D sums");
};

template <typename T>
struct Operand;  // WMMA's element type of a storage type
template <>
struct Operand<half_t> {
  using type = __half;
};
template <>
struct Operand<bf16_t> {
  using type = __nv_bfloat16;
};

using Accumulator = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

// rows [first, first + count) of a [total, kD] tensor of 16-bit values into a
// [count][head] tile, in 16-byte vectors; zeros past `total`.
template <int kD>
__device__ void load_rows(const uint16_t* src, int64_t first, int count, int64_t total, uint16_t* tile) {
  constexpr int kVectors = kD / 8;
  for (int idx = static_cast<int>(threadIdx.x); idx < count * kVectors; idx += kThreads) {
    const int r = idx / kVectors, c = (idx % kVectors) * 8;
    const int64_t row = first + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < total) v = *reinterpret_cast<const uint4*>(src + row * kD + c);
    *reinterpret_cast<uint4*>(tile + r * Strides<kD>::head + c) = v;
  }
}

// dst (16 x kCols FP32, row stride `score`) = a (16 rows) . b (kCols rows)^T,
// both [rows][head] 16-bit tiles: scores, or dP = dO V^T.
template <typename E, int kD>
__device__ void product_abt(const uint16_t* a, const uint16_t* b, float* dst) {
  constexpr int ld = Strides<kD>::head;
  const E* a_e = reinterpret_cast<const E*>(a);
  const E* b_e = reinterpret_cast<const E*>(b);
  MIX_UNROLL
  for (int nb = 0; nb < kCols / kFrag; ++nb) {
    Accumulator acc;
    wmma::fill_fragment(acc, 0.f);
    MIX_UNROLL
    for (int kk = 0; kk < kD / kFrag; ++kk) {
      wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, E, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, E, wmma::col_major> fb;  // b^T: b's rows as columns
      wmma::load_matrix_sync(fa, a_e + kk * kFrag, ld);
      wmma::load_matrix_sync(fb, b_e + nb * kFrag * ld + kk * kFrag, ld);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(dst + nb * kFrag, acc, Strides<kD>::score, wmma::mem_row_major);
  }
}

// acc[cb] (16 x 16 columns cb of 16 x kD) += a (16 x kCols 16-bit, row stride
// `prob`) . b (kCols rows of a [rows][head] tile): P V, P^T dO, dS K, dS^T Q.
template <typename E, int kD>
__device__ void accumulate_ab(Accumulator (&acc)[kD / kFrag], const uint16_t* a, const uint16_t* b) {
  constexpr int ld = Strides<kD>::head;
  const E* a_e = reinterpret_cast<const E*>(a);
  const E* b_e = reinterpret_cast<const E*>(b);
  MIX_UNROLL
  for (int kk = 0; kk < kCols / kFrag; ++kk) {
    wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, E, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a_e + kk * kFrag, Strides<kD>::prob);
    MIX_UNROLL
    for (int cb = 0; cb < kD / kFrag; ++cb) {
      wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, E, wmma::row_major> fb;
      wmma::load_matrix_sync(fb, b_e + kk * kFrag * ld + cb * kFrag, ld);
      wmma::mma_sync(acc[cb], fa, fb, acc[cb]);
    }
  }
}

// Stores a warp's 16 x kD sums: row r of them goes to dst row first + r (rows
// past `total` skipped) as factor * sum rounded to T, through the warp's FP32
// scratch (two lanes a row, every other column each, as everywhere here).
template <typename T, int kD>
__device__ void store_sums(Accumulator (&acc)[kD / kFrag], float* scratch, T* dst, int64_t first, int64_t total,
                           float factor) {
  constexpr int ld = Strides<kD>::out;
  MIX_UNROLL
  for (int cb = 0; cb < kD / kFrag; ++cb)
    wmma::store_matrix_sync(scratch + cb * kFrag, acc[cb], ld, wmma::mem_row_major);
  __syncwarp();
  const int lane = static_cast<int>(threadIdx.x) % 32, r = lane / 2, side = lane % 2;
  if (first + r < total) {
    const float* src = scratch + r * ld;
    T* row = dst + (first + r) * kD;
    for (int c = side; c < kD; c += 2) row[c] = from_float<T>(src[c] * factor);
  }
  __syncwarp();
}

// A backward kernel's shared memory: the block's own rows of two tensors
// (kRows each: K and V, or Q and dO), a tile of the other side's two (kCols
// each), this warp's two FP32 score buffers (contiguous: also the scratch its
// sums are stored through) and kProbs 16-bit buffers, and `kColFloats` FP32
// values for each column of a tile.
template <int kD, int kProbs, int kColFloats>
struct BackwardShared {
  using S = Strides<kD>;
  uint16_t *own_a, *own_b, *tile_a, *tile_b;
  float *scores_a, *scores_b;
  uint16_t* probs;  // buffer b of them at probs + b * kFrag * prob
  float* per_col;   // [kColFloats][kCols]
  // The calling thread's view: its warp's buffers.
  __device__ BackwardShared() {
    const int warp = static_cast<int>(threadIdx.x) / 32;
    own_a = reinterpret_cast<uint16_t*>(dynamic_shared());
    own_b = own_a + kRows * S::head;
    tile_a = own_b + kRows * S::head;
    tile_b = tile_a + kCols * S::head;
    float* floats = reinterpret_cast<float*>(tile_b + kCols * S::head);
    scores_a = floats + warp * 2 * kFrag * S::score;
    scores_b = scores_a + kFrag * S::score;
    uint16_t* all_probs = reinterpret_cast<uint16_t*>(floats + kWarps * 2 * kFrag * S::score);
    probs = all_probs + warp * kProbs * kFrag * S::prob;
    per_col = reinterpret_cast<float*>(all_probs + kWarps * kProbs * kFrag * S::prob);
  }
  static constexpr size_t bytes() {
    return S::tiles(2 * kRows + 2 * kCols) + S::backward_floats() + S::warp_probs(kProbs) +
           static_cast<size_t>(kColFloats) * kCols * sizeof(float);
  }
};

// The forward's dynamic shared memory, as forward_kernel lays it out: the
// Q, K and V tiles, each warp's FP32 scores and output sums, its 16-bit P.
template <int kD>
struct ForwardShared {
  using S = Strides<kD>;
  static constexpr size_t bytes() { return S::tiles(kRows + 2 * kCols) + S::forward_floats() + S::warp_probs(1); }
};

template <int kD>
using GradKvShared = BackwardShared<kD, 2, 2>;  // P^T and dS^T; LSE and delta of the query tile
template <int kD>
using GradQShared = BackwardShared<kD, 1, 0>;  // dS

// ---- kernels ---------------------------------------------------------------------------

// Out and LSE of 64 queries (blockIdx.y) of one group (blockIdx.x).
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* v, T* out, float* lse, AttentionDims a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // applies() keeps older GPUs on the FP32 kernels
#else
  using E = typename Operand<T>::type;
  using S = Strides<kD>;
  unsigned char* shared = dynamic_shared();
  uint16_t* q_sh = reinterpret_cast<uint16_t*>(shared);  // [kRows][head]
  uint16_t* k_sh = q_sh + kRows * S::head;               // [kCols][head]
  uint16_t* v_sh = k_sh + kCols * S::head;               // [kCols][head]
  float* floats = reinterpret_cast<float*>(v_sh + kCols * S::head);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  float* s_w = floats + warp * kFrag * (S::score + S::out);  // this warp's scores, [16][score]
  float* o_w = s_w + kFrag * S::score;                       // and output sums, [16][out]
  uint16_t* p_w = reinterpret_cast<uint16_t*>(floats + kWarps * kFrag * (S::score + S::out)) + warp * kFrag * S::prob;

  const int64_t g = blockIdx.x, first = static_cast<int64_t>(blockIdx.y) * kRows;
  const uint16_t* kg = k + g * a.t_k * kD;
  const uint16_t* vg = v + g * a.t_k * kD;
  load_rows<kD>(q + g * a.t_q * kD, first, kRows, a.t_q, q_sh);
  // This lane's row of the warp's 16 (its query i, seeing n keys); it takes every other column.
  const int r = lane / 2, side = lane % 2;
  const int64_t i = first + warp * kFrag + r;
  const int64_t n = i < a.t_q ? fn::attention_visible_keys(i, a.t_q, a.t_k, a.causal) : 0;
  for (int c = side; c < kD; c += 2) o_w[r * S::out + c] = 0.f;
  float max = -INFINITY, sum_exp = 0.f;

  const int64_t last = std::min<int64_t>(first + kRows, a.t_q) - 1;
  const int64_t key_end = fn::attention_visible_keys(last, a.t_q, a.t_k, a.causal);
  for (int64_t k0 = 0; k0 < key_end; k0 += kCols) {
    __syncthreads();  // the last tile's readers are done (the first time: nothing)
    load_rows<kD>(kg, k0, kCols, a.t_k, k_sh);
    load_rows<kD>(vg, k0, kCols, a.t_k, v_sh);
    __syncthreads();
    product_abt<E, kD>(q_sh + warp * kFrag * S::head, k_sh, s_w);
    __syncwarp();
    // Online softmax over this tile: the row's new max, the factor that
    // carries its sums over, the weights exp(s - max) (FP32 into the sum,
    // rounded to T into P V) and the rescaled output sums.
    float* s_row = s_w + r * S::score;
    float tile_max = -INFINITY;
    for (int c = side; c < kCols; c += 2) {
      const float s = k0 + c < n ? fn::attention_score(s_row[c], a.scale) : -INFINITY;
      s_row[c] = s;
      tile_max = fn::max_of(tile_max, s);
    }
    tile_max = fn::max_of(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
    const float new_max = fn::max_of(max, tile_max);
    const float carry = fn::attention_rescale(max, new_max);
    float tile_sum = 0.f;
    uint16_t* p_row = p_w + r * S::prob;
    for (int c = side; c < kCols; c += 2) {
      const float e = k0 + c < n ? fn::exp_shifted(s_row[c], new_max) : 0.f;
      tile_sum += e;
      p_row[c] = from_float<T>(e).bits;
    }
    tile_sum += __shfl_xor_sync(kFullMask, tile_sum, 1);
    sum_exp = sum_exp * carry + tile_sum;
    max = new_max;
    float* o_row = o_w + r * S::out;
    for (int c = side; c < kD; c += 2) o_row[c] *= carry;
    __syncwarp();
    // o_w += P V, through accumulators loaded from and stored to it.
    Accumulator acc[kD / kFrag];
    MIX_UNROLL
    for (int cb = 0; cb < kD / kFrag; ++cb)
      wmma::load_matrix_sync(acc[cb], o_w + cb * kFrag, S::out, wmma::mem_row_major);
    accumulate_ab<E, kD>(acc, p_w, v_sh);
    MIX_UNROLL
    for (int cb = 0; cb < kD / kFrag; ++cb)
      wmma::store_matrix_sync(o_w + cb * kFrag, acc[cb], S::out, wmma::mem_row_major);
    __syncwarp();
  }
  if (i < a.t_q) {
    const float* o_row = o_w + r * S::out;
    T* dst = out + (g * a.t_q + i) * kD;
    for (int c = side; c < kD; c += 2) dst[c] = from_float<T>(fn::attention_output(o_row[c], sum_exp));
    if (side == 0) lse[g * a.t_q + i] = fn::attention_log_sum_exp(max, sum_exp);
  }
#endif
}

// P and dS of one score and one dP: p = exp(s - lse), dS = p (dP - delta);
// zeros where the query does not see the key.
struct ProbAndGrad {
  float p, ds;
};
__device__ __forceinline__ ProbAndGrad prob_and_grad(bool seen, float dot, float dp, float lse, float delta,
                                                     float scale) {
  if (!seen) return {0.f, 0.f};
  const float p = fn::attention_prob(fn::attention_score(dot, scale), lse);
  return {p, fn::SoftmaxGradElem{delta}(p, dp)};
}

// dK and dV of 64 keys (blockIdx.y) of one group (blockIdx.x), over every
// query tile that sees them. The warp's scores and dP are transposed here
// (keys as rows): S^T = K Q^T, dP^T = V dO^T.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    grad_kv_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout, const float* lse,
                   const float* delta, T* dk, T* dv, AttentionDims a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using E = typename Operand<T>::type;
  using S = Strides<kD>;
  const GradKvShared<kD> sh;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  uint16_t *k_sh = sh.own_a, *v_sh = sh.own_b;                     // the block's keys, [kRows][head]
  uint16_t *q_sh = sh.tile_a, *do_sh = sh.tile_b;                  // a query tile, [kCols][head]
  float *st_w = sh.scores_a, *dpt_w = sh.scores_b;                 // this warp's S^T and dP^T, [16][score]
  uint16_t *pt_w = sh.probs, *dst_w = sh.probs + kFrag * S::prob;  // its P^T and dS^T, [16][prob]
  float *lse_sh = sh.per_col, *delta_sh = sh.per_col + kCols;      // the query tile's, [kCols]

  const int64_t g = blockIdx.x, first = static_cast<int64_t>(blockIdx.y) * kRows;
  const uint16_t* qg = q + g * a.t_q * kD;
  const uint16_t* dog = dout + g * a.t_q * kD;
  load_rows<kD>(k + g * a.t_k * kD, first, kRows, a.t_k, k_sh);
  load_rows<kD>(v + g * a.t_k * kD, first, kRows, a.t_k, v_sh);
  const int r = lane / 2, side = lane % 2;
  const int64_t j = first + warp * kFrag + r;  // this lane's key

  Accumulator dk_acc[kD / kFrag], dv_acc[kD / kFrag];
  MIX_UNROLL
  for (int cb = 0; cb < kD / kFrag; ++cb) {
    wmma::fill_fragment(dk_acc[cb], 0.f);
    wmma::fill_fragment(dv_acc[cb], 0.f);
  }
  // Under causal, key `first` is first seen by query first - (S - T).
  const int64_t query_begin = a.causal ? std::max<int64_t>(0, first - (a.t_k - a.t_q)) : 0;
  for (int64_t q0 = query_begin; q0 < a.t_q; q0 += kCols) {
    __syncthreads();
    load_rows<kD>(qg, q0, kCols, a.t_q, q_sh);
    load_rows<kD>(dog, q0, kCols, a.t_q, do_sh);
    if (threadIdx.x < kCols) {
      const int64_t iq = q0 + threadIdx.x;
      lse_sh[threadIdx.x] = iq < a.t_q ? lse[g * a.t_q + iq] : 0.f;
      delta_sh[threadIdx.x] = iq < a.t_q ? delta[g * a.t_q + iq] : 0.f;
    }
    __syncthreads();
    product_abt<E, kD>(k_sh + warp * kFrag * S::head, q_sh, st_w);
    product_abt<E, kD>(v_sh + warp * kFrag * S::head, do_sh, dpt_w);
    __syncwarp();
    for (int col = side; col < kCols; col += 2) {
      const int64_t iq = q0 + col;
      const bool seen = iq < a.t_q && j < a.t_k && j < fn::attention_visible_keys(iq, a.t_q, a.t_k, a.causal);
      const ProbAndGrad pg =
          prob_and_grad(seen, st_w[r * S::score + col], dpt_w[r * S::score + col], lse_sh[col], delta_sh[col], a.scale);
      pt_w[r * S::prob + col] = from_float<T>(pg.p).bits;
      dst_w[r * S::prob + col] = from_float<T>(pg.ds).bits;
    }
    __syncwarp();
    accumulate_ab<E, kD>(dv_acc, pt_w, do_sh);  // dV += P^T dO
    accumulate_ab<E, kD>(dk_acc, dst_w, q_sh);  // dK += dS^T Q (times scale on store)
  }
  const int64_t warp_first = first + warp * kFrag;
  store_sums<T, kD>(dk_acc, st_w, dk + g * a.t_k * kD, warp_first, a.t_k, a.scale);
  store_sums<T, kD>(dv_acc, st_w, dv + g * a.t_k * kD, warp_first, a.t_k, 1.f);
#endif
}

// dQ of 64 queries (blockIdx.y) of one group (blockIdx.x), over the key tiles
// they see.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    grad_q_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout, const float* lse,
                  const float* delta, T* dq, AttentionDims a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using E = typename Operand<T>::type;
  using S = Strides<kD>;
  const GradQShared<kD> sh;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  uint16_t *q_sh = sh.own_a, *do_sh = sh.own_b;   // the block's queries, [kRows][head]
  uint16_t *k_sh = sh.tile_a, *v_sh = sh.tile_b;  // a key tile, [kCols][head]
  float *s_w = sh.scores_a, *dp_w = sh.scores_b;  // this warp's S and dP, [16][score]
  uint16_t* ds_w = sh.probs;                      // its dS, [16][prob]

  const int64_t g = blockIdx.x, first = static_cast<int64_t>(blockIdx.y) * kRows;
  const uint16_t* kg = k + g * a.t_k * kD;
  const uint16_t* vg = v + g * a.t_k * kD;
  load_rows<kD>(q + g * a.t_q * kD, first, kRows, a.t_q, q_sh);
  load_rows<kD>(dout + g * a.t_q * kD, first, kRows, a.t_q, do_sh);
  const int r = lane / 2, side = lane % 2;
  const int64_t i = first + warp * kFrag + r;  // this lane's query
  const bool real = i < a.t_q;
  const int64_t n = real ? fn::attention_visible_keys(i, a.t_q, a.t_k, a.causal) : 0;
  const float lse_i = real ? lse[g * a.t_q + i] : 0.f, delta_i = real ? delta[g * a.t_q + i] : 0.f;

  Accumulator dq_acc[kD / kFrag];
  MIX_UNROLL
  for (int cb = 0; cb < kD / kFrag; ++cb) wmma::fill_fragment(dq_acc[cb], 0.f);
  const int64_t last = std::min<int64_t>(first + kRows, a.t_q) - 1;
  const int64_t key_end = fn::attention_visible_keys(last, a.t_q, a.t_k, a.causal);
  for (int64_t k0 = 0; k0 < key_end; k0 += kCols) {
    __syncthreads();
    load_rows<kD>(kg, k0, kCols, a.t_k, k_sh);
    load_rows<kD>(vg, k0, kCols, a.t_k, v_sh);
    __syncthreads();
    product_abt<E, kD>(q_sh + warp * kFrag * S::head, k_sh, s_w);
    product_abt<E, kD>(do_sh + warp * kFrag * S::head, v_sh, dp_w);
    __syncwarp();
    for (int col = side; col < kCols; col += 2) {
      const ProbAndGrad pg =
          prob_and_grad(k0 + col < n, s_w[r * S::score + col], dp_w[r * S::score + col], lse_i, delta_i, a.scale);
      ds_w[r * S::prob + col] = from_float<T>(pg.ds).bits;
    }
    __syncwarp();
    accumulate_ab<E, kD>(dq_acc, ds_w, k_sh);  // dQ += dS K (times scale on store)
  }
  store_sums<T, kD>(dq_acc, s_w, dq + g * a.t_q * kD, first + warp * kFrag, a.t_q, a.scale);
#endif
}

// f(std::integral_constant<int, D>{}) when d is one of the head dims D these
// kernels are built for; whether it was (the launchers' dispatch and applies()'s rule).
template <typename F>
bool with_head_dim(int64_t d, F&& f) {
  const auto one = [&](auto dim) { return d == decltype(dim)::value && (f(dim), true); };
  return one(std::integral_constant<int, 32>{}) || one(std::integral_constant<int, 64>{}) ||
         one(std::integral_constant<int, 96>{}) || one(std::integral_constant<int, 128>{});
}

}  // namespace
}  // namespace mix::cuda::attention_tensor_cores
