// CUDA kernels of fused_attention and fused_attention_grad
// (runtime/ops/fused_attention.cc has the op, its CPU twin and the rounding
// points): tiled kernels in the manner of FlashAttention, the [T, S] scores
// never written to memory. The math is runtime/kernels/attention_row.h's, the
// CPU twin's; only the order of the FP32 sums differs.
//
// These FP32 kernels run every problem the tensor-core kernels
// (fused_attention_tensor_cores.cu) do not take: FP32 tensors, other head
// dims, GPUs before sm_80, CudaAttentionKernels::fp32_only.
//
// Why not cuDNN's fused attention (its SDPA engines through the graph API
// that the convolutions use, runtime/cuda/cudnn_conv_graph.cc): through the
// backend API the forward is a graph of some twenty operations (two matmuls,
// the scale, the causal mask as index generation, compare and select, the
// max and sum reductions, exp, log) and the backward twice that, and cuDNN
// runs it only when the graph matches its SDPA pattern exactly; whether it
// does can only be seen on a GPU (cuDNN 9.19's single SDPA operation,
// CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, takes no causal mask). These
// kernels and the tensor-core ones are the paths that are tested
// against the CPU twin; cuDNN's engine, where faster, is to come behind the
// same op, as the convolutions' graph plans came behind their legacy calls.
//
// Layout: Q [groups, T, D], K and V [groups, S, D] contiguous (groups =
// batch x heads); D <= kMaxHeadDim. Each warp owns kRowsPerWarp rows (query
// rows, or key rows in the dK/dV kernel) and each lane kChunks of their D
// values (columns lane, lane + 32, ...); the other side of the product comes
// in tiles of 32 rows through shared memory, one row per lane, so that a
// lane computes a whole dot product (shared rows padded to D + 1 floats:
// lane l reads row l, no two lanes in one bank).
//
//  - forward: a block per (group, tile of kBlockRows queries), online
//    softmax over key tiles: a row's running max and sum of exp(s - max),
//    its output sum rescaled when the max grows (fn::attention_rescale);
//    then Out = sum / sum_exp and LSE = max + log(sum_exp).
//  - backward, deterministic (no atomics; each gradient element is summed by
//    one thread in a fixed order): delta_i = dO_i . O_i a warp per row; dK and
//    dV a block per (group, tile of kBlockRows keys) over query tiles; dQ a
//    block per (group, tile of kBlockRows queries) over key tiles. Each
//    recomputes p = exp(s - lse) from Q, K and LSE.
// Causal tiles stop at the last key their last query sees (dK/dV: start at
// the first query that sees their first key), so masked tiles cost nothing.
#include <algorithm>
#include <cstdint>

#include "runtime/kernels/attention_row.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/cuda/fused_attention_tensor_cores.cuh"
#include "runtime/ops/fused_attention_shapes.h"

namespace mix::cuda {
namespace {

using attention_rules::AttentionDims;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarp;
constexpr int kRowsPerWarp = 4;
constexpr int kBlockRows = kWarps * kRowsPerWarp;  // query (or key) rows per block
constexpr int kTile = kWarp;                       // rows of the other side per shared tile: a row per lane
constexpr int64_t kMaxHeadDim = 256;               // 8 values per lane
constexpr unsigned kFullMask = 0xffffffffu;

// ---- tiles in shared memory --------------------------------------------------------------

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
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr)
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch) rows[rr][ch] = 0.f;
}

// Stores a warp's rows, row rr as dst row first + rr (rows past `total`
// skipped), each value as value(rr, accumulated) rounded to T: the one
// rounding of every output.
template <typename T, int kChunks, typename Value>
__device__ __forceinline__ void store_rows(const WarpRows<kChunks>& rows, T* dst, int64_t first, int64_t total,
                                           int64_t d, Value value) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    if (first + rr >= total) break;
#pragma unroll
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
#pragma unroll
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
#pragma unroll
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
  extern __shared__ float shared[];
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
#pragma unroll
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
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch) acc[rr][ch] *= carry;
    add_weighted_rows(acc[rr], e, v_sh, d, std::min<int64_t>(kTile, n - k0), d);
  });
  const int64_t warp_first = first + warp * kRowsPerWarp;
  store_rows(acc, out + g * a.t_q * d, warp_first, a.t_q, d,
             [&](int rr, float weighted_sum) { return fn::attention_output(weighted_sum, sum_exp[rr]); });
#pragma unroll
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
  extern __shared__ float shared[];
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
#pragma unroll
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
  extern __shared__ float shared[];
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

// ---- launchers -----------------------------------------------------------------------------

// f(std::integral_constant<int, kChunks>{}): values per lane for head_dim d.
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

dim3 grid_of(const AttentionDims& a, int64_t rows) {
  return dim3(static_cast<unsigned>(a.groups), static_cast<unsigned>((rows + kBlockRows - 1) / kBlockRows));
}

// Launches `kernel` with `floats` of dynamic shared memory, raising the
// kernel's limit first when that is above the default 48 KiB.
template <typename Kernel, typename... Args>
void launch_tiles(Kernel kernel, dim3 grid, int64_t floats, cudaStream_t stream, Args... args) {
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  if (bytes > 48 * 1024)
    MIX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  kernel<<<grid, kThreads, bytes, stream>>>(args...);
  MIX_CUDA_CHECK(cudaGetLastError());
}

AttentionDims checked_dims(const OpContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v) {
  check_on_device(ctx, q, "Q");
  check_on_device(ctx, k, "K");
  check_on_device(ctx, v, "V");
  const AttentionDims a = attention_rules::dims_of(ctx.op, q, k, v);
  MIX_CHECK(a.d <= kMaxHeadDim, ctx.op.type << ": the CUDA kernels take head_dim up to " << kMaxHeadDim << ", got "
                                            << a.d << " (" << attention_rules::describe(q.shape(), k.shape(), v.shape())
                                            << ")");
  MIX_CHECK(a.groups <= INT32_MAX && (std::max(a.t_q, a.t_k) + kBlockRows - 1) / kBlockRows <= 65535,
            ctx.op.type << ": too many (batch, head) pairs or tokens for one launch: "
                        << attention_rules::describe(q.shape(), k.shape(), v.shape()));
  return a;
}

void fused_attention_cuda(OpContext& ctx) {
  const Tensor q = ctx.in("Q"), k = ctx.in("K"), v = ctx.in("V");
  const AttentionDims a = checked_dims(ctx, q, k, v);
  Tensor& out = ctx.out("Out", q.shape(), q.dtype());
  Tensor lse_tmp;
  Tensor* lse = nullptr;
  if (ctx.wants("LSE")) {
    lse = &ctx.out("LSE", attention_rules::lse_shape(q.shape()), DType::f32);
  } else {
    lse_tmp = Tensor::empty({a.groups * a.t_q}, DType::f32, ctx.env.device);
    lse = &lse_tmp;
  }
  if (a.groups == 0 || a.t_q == 0) return;
  const cudaStream_t stream = compute_stream(ctx);
  if (attention_tensor_cores::applies(a, q.dtype(), {q.raw(), k.raw(), v.raw(), out.raw()})) {
    attention_tensor_cores::forward(a, q.dtype(), q.raw(), k.raw(), v.raw(), out.raw(), lse->data<float>(), stream);
    return;
  }
  const int64_t floats = kBlockRows * a.d + kTile * (a.d + 1) + kTile * a.d;
  dispatch_floating(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    with_head_chunks(a.d, [&](auto chunks) {
      launch_tiles(attention_forward<T, decltype(chunks)::value>, grid_of(a, a.t_q), floats, stream, q.data<T>(),
                   k.data<T>(), v.data<T>(), out.data<T>(), lse->data<float>(), a);
    });
  });
}

void fused_attention_grad_cuda(OpContext& ctx) {
  const Tensor q = ctx.in("Q"), k = ctx.in("K"), v = ctx.in("V");
  const Tensor out = ctx.in("Out"), lse = ctx.in("LSE"), dout = ctx.in("Out@GRAD");
  const AttentionDims a = checked_dims(ctx, q, k, v);
  attention_rules::check_grad_inputs(ctx.op, q, out, lse, dout);
  check_on_device(ctx, out, "Out");
  check_on_device(ctx, lse, "LSE");
  check_on_device(ctx, dout, "Out@GRAD");
  const bool want_q = ctx.wants("Q@GRAD"), want_kv = ctx.wants("K@GRAD") || ctx.wants("V@GRAD");
  // The kernels write dK and dV together: an unwanted one goes to scratch.
  Tensor dk_tmp, dv_tmp;
  Tensor* dq = want_q ? &ctx.out("Q@GRAD", q.shape(), q.dtype()) : nullptr;
  Tensor* dk = nullptr;
  Tensor* dv = nullptr;
  if (want_kv) {
    if (ctx.wants("K@GRAD")) {
      dk = &ctx.out("K@GRAD", k.shape(), k.dtype());
    } else {
      dk_tmp = Tensor::empty(k.shape(), k.dtype(), ctx.env.device);
      dk = &dk_tmp;
    }
    if (ctx.wants("V@GRAD")) {
      dv = &ctx.out("V@GRAD", v.shape(), v.dtype());
    } else {
      dv_tmp = Tensor::empty(v.shape(), v.dtype(), ctx.env.device);
      dv = &dv_tmp;
    }
  }
  if (a.groups == 0) return;
  const cudaStream_t stream = compute_stream(ctx);
  const int64_t rows = a.groups * a.t_q;
  Tensor delta = Tensor::empty({std::max<int64_t>(rows, 1)}, DType::f32, ctx.env.device);
  const bool tensor_cores =
      attention_tensor_cores::applies(a, q.dtype(),
                                      {q.raw(), k.raw(), v.raw(), dout.raw(), dq ? dq->raw() : nullptr,
                                       dk ? dk->raw() : nullptr, dv ? dv->raw() : nullptr});
  dispatch_floating(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (rows > 0) {
      const unsigned blocks = static_cast<unsigned>(std::clamp<int64_t>((rows + kWarps - 1) / kWarps, 1, 65535));
      attention_delta<T>
          <<<blocks, kThreads, 0, stream>>>(out.data<T>(), dout.data<T>(), delta.data<float>(), rows, a.d);
      MIX_CUDA_CHECK(cudaGetLastError());
    }
    if (tensor_cores) {
      attention_tensor_cores::grad(a, q.dtype(), q.raw(), k.raw(), v.raw(), dout.raw(), lse.data<float>(),
                                   delta.data<float>(), dq ? dq->raw() : nullptr, dk ? dk->raw() : nullptr,
                                   dv ? dv->raw() : nullptr, stream);
      return;
    }
    with_head_chunks(a.d, [&](auto chunks) {
      constexpr int kChunks = decltype(chunks)::value;
      const int64_t padded = a.d + 1;
      if (want_kv && a.t_k > 0)  // with no query, the kernel writes zeros
        launch_tiles(attention_grad_kv<T, kChunks>, grid_of(a, a.t_k),
                     2 * kBlockRows * a.d + 2 * kTile * padded + 2 * kTile, stream, q.data<T>(), k.data<T>(),
                     v.data<T>(), dout.data<T>(), lse.data<float>(), delta.data<float>(), dk->data<T>(), dv->data<T>(),
                     a);
      if (want_q && a.t_q > 0)
        launch_tiles(attention_grad_q<T, kChunks>, grid_of(a, a.t_q), 2 * kBlockRows * a.d + 2 * kTile * padded, stream,
                     q.data<T>(), k.data<T>(), v.data<T>(), dout.data<T>(), lse.data<float>(), delta.data<float>(),
                     dq->data<T>(), a);
    });
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("fused_attention", fused_attention_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("fused_attention_grad", fused_attention_grad_cuda);

}  // namespace
}  // namespace mix::cuda
