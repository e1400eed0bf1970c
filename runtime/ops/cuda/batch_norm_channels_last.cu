// The kernels of runtime/ops/cuda/batch_norm_channels_last.cuh.
//
// Launch shapes. The sums (passes 1) split X as runtime/kernels/bn_channel_sums.h
// says (blocks of 256 threads over tiles of channel groups and chunks of
// about 16 rows a thread; 16-byte loads when C is a multiple of the pack
// width), the thread's share written there for host and device and tested on
// the CPU. The chunks' partial sums are added per channel in double by one
// block (passes 2). The elementwise passes 3, when C is a multiple of the
// pack width V, give each thread one group of V adjacent channels for all its
// rows (adjacent threads on adjacent groups of a row: 16-byte loads, a warp
// reading 512 contiguous bytes), so it loads that group's per-channel values
// into registers once instead of with every element; otherwise one element
// per thread, its channel found by a division.
#include "runtime/ops/cuda/batch_norm_channels_last.cuh"

#include "runtime/kernels/bn_channel_sums.h"
#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/device_ops.cuh"

namespace mix::cuda {
namespace {

using kernels::BnSumGeometry;

// A partial-sum launch: its split, and where the sums go ([c, chunks] each).
struct Partials {
  BnSumGeometry g;
  Tensor first, second;  // FP32 [c, chunks]
};

// The split of X [m, c] for T: packs of kPackWidth<T> channels where C and
// the tensors allow (`packed`), else one channel a thread.
template <typename T>
Partials make_partials(const BatchNormDims& d, bool packed, Device dev) {
  const BnSumGeometry g = kernels::bn_sum_geometry(d.n * d.spatial, d.c, packed ? kPackWidth<T> : 1);
  return {g, Tensor::empty({d.c, g.chunks}, DType::f32, dev), Tensor::empty({d.c, g.chunks}, DType::f32, dev)};
}

// Whether the partial sums can read X (and dY) in packs of kPackWidth<T>.
template <typename T>
bool packs_fit(const BatchNormDims& d, const Tensor& x, const Tensor* dy) {
  constexpr int V = kPackWidth<T>;
  return d.c % V == 0 && pack_aligned(x.data<T>(), V) && (!dy || pack_aligned(dy->data<T>(), V));
}

// Pass 1 of both directions (Terms: kernels::BnStatsTerms, BnGradTerms):
// each thread's sums (kernels::bn_thread_sums), then each channel's over the
// block's row lanes in order, into first and second at [ch, chunk].
template <int V, typename Terms>
__global__ void __launch_bounds__(kernels::kBnSumThreads)
    chunk_partials(BnSumGeometry g, Terms terms, float* first, float* second) {
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

// Launches pass 1 over `part`'s split; T is X's storage type.
template <typename T, typename Terms>
void launch_partials(Partials& part, const Terms& terms, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(part.g.tiles), static_cast<unsigned>(part.g.chunks));
  float* first = part.first.data<float>();
  float* second = part.second.data<float>();
  if (part.g.vec == 1)
    chunk_partials<1><<<grid, kernels::kBnSumThreads, 0, stream>>>(part.g, terms, first, second);
  else
    chunk_partials<kPackWidth<T>><<<grid, kernels::kBnSumThreads, 0, stream>>>(part.g, terms, first, second);
  MIX_CUDA_CHECK(cudaGetLastError());
}

// The chunks' partial sums of channel blockIdx.x in double (fixed tree).
// All threads of the block call it and get the total.
__device__ double channel_total(const float* partial, int64_t chunks, double* shared) {
  const float* row = partial + static_cast<int64_t>(blockIdx.x) * chunks;
  double s = 0.0;
  for (int64_t k = threadIdx.x; k < chunks; k += kBlock) s = __dadd_rn(s, static_cast<double>(row[k]));
  return block_reduce(s, shared, AddRnDouble{});
}

// Forward pass 2 (one block of kBlock threads per channel): the statistics.
template <typename T>
__global__ void stats_finalize(const T* x, const float* sum, const float* sum_sq, int64_t chunks, int64_t m,
                               const float* running_mean, const float* running_var, float momentum, float eps,
                               float* mean_out, float* var_out, float* saved_mean, float* saved_inv_std) {
  __shared__ double shared[kBlock / kWarp];
  const int64_t ch = blockIdx.x;
  const double s = channel_total(sum, chunks, shared);
  const double q = channel_total(sum_sq, chunks, shared);
  if (threadIdx.x != 0) return;
  const fn::BnBatchStats st = fn::bn_batch_stats(s, q, static_cast<double>(to_float(x[ch])), m);
  const float running_m = running_mean[ch], running_v = running_var[ch];  // read first: outputs may alias
  saved_mean[ch] = static_cast<float>(st.mean);
  saved_inv_std[ch] = fn::bn_inv_std(static_cast<float>(st.var), eps);
  mean_out[ch] = fn::bn_running_update(running_m, static_cast<float>(st.mean), momentum);
  var_out[ch] = fn::bn_running_update(running_v, static_cast<float>(fn::bn_unbiased_var(st.var, m)), momentum);
}

// Evaluation: inv_std[ch] = 1 / sqrt(running_var + eps), once per channel.
struct RunningInvStd {
  const float* running_var;
  float eps;
  float* inv_std;
  __device__ void operator()(int64_t ch) const { inv_std[ch] = fn::bn_inv_std(running_var[ch], eps); }
};

// Blocks of the column-group maps: enough threads for every group of a row,
// at most kMaxColumnBlocks (each thread then loops over rows; the bound
// depends on nothing but this constant).
constexpr int64_t kMaxColumnBlocks = 2048;

// Runs f.column_rows<V>(col, first_row, row_step) on every thread that has
// a column group: thread t takes group t % groups and rows t / groups,
// t / groups + row_step, ... (row_step = the threads' count / groups).
template <int V, typename F>
__global__ void column_group_kernel(int64_t rows, int64_t c, F f) {
  const int64_t groups = c / V;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t row_step = threads / groups;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= row_step * groups) return;
  f.template column_rows<V>((t % groups) * V, t / groups, row_step, rows);
}

// An elementwise pass over X [rows, c]: column groups of V when c allows
// and f.packable(V), else f(i) for each element.
template <int V, typename F>
void launch_channel_map(int64_t rows, int64_t c, cudaStream_t stream, F f) {
  if (rows * c == 0) return;
  if (c % V != 0 || !f.packable(V)) return launch_grid_stride(rows * c, stream, f);
  const int64_t groups = c / V;
  const int64_t blocks =
      std::clamp<int64_t>((rows * groups + kMapThreads - 1) / kMapThreads, (groups + kMapThreads - 1) / kMapThreads,
                          std::max<int64_t>(kMaxColumnBlocks, (groups + kMapThreads - 1) / kMapThreads));
  column_group_kernel<V><<<static_cast<unsigned>(blocks), kMapThreads, 0, stream>>>(rows, c, f);
  MIX_CUDA_CHECK(cudaGetLastError());
}

// Forward pass 3: y = relu?((x - mean) * (inv_std * scale) + bias), the CPU's functor.
template <typename T>
struct NormalizeMap {
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
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = channel(col + k);
    for (int64_t r = first_row; r < rows; r += row_step) {
      const Pack<T, V> xs = load_pack<V>(x, r * c + col);
      Pack<T, V> zs{};
      if (z) zs = load_pack<V>(z, r * c + col);
      Pack<T, V> out;
#pragma unroll
      for (int k = 0; k < V; ++k) out.v[k] = from_float<T>(value(f[k], to_float(xs.v[k]), to_float(zs.v[k])));
      store_pack<V>(y, r * c + col, out);
    }
  }
  bool packable(int v) const { return pack_aligned(x, v) && pack_aligned(y, v) && (!z || pack_aligned(z, v)); }
};

// Backward pass 2 (one block per channel): the parameter gradients and the
// means of g and g xhat (mean_g, mean_g_xhat: [c] each).
__global__ void grad_finalize(const float* sum_g, const float* sum_g_xhat, int64_t chunks, int64_t m, float* dscale,
                              float* dbias, float* mean_g, float* mean_g_xhat) {
  __shared__ double shared[kBlock / kWarp];
  const int64_t ch = blockIdx.x;
  const double s = channel_total(sum_g, chunks, shared);
  const double sx = channel_total(sum_g_xhat, chunks, shared);
  if (threadIdx.x != 0) return;
  dscale[ch] = static_cast<float>(sx);
  dbias[ch] = static_cast<float>(s);
  mean_g[ch] = static_cast<float>(s / static_cast<double>(m));
  mean_g_xhat[ch] = static_cast<float>(sx / static_cast<double>(m));
}

// Backward pass 3: dx = BnBackward(x, g), the CPU's functor.
template <typename T>
struct GradMap {
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
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = channel(col + k);
    for (int64_t r = first_row; r < rows; r += row_step) {
      const Pack<T, V> xs = load_pack<V>(x, r * c + col), dys = load_pack<V>(dy, r * c + col);
      Pack<T, V> out;
#pragma unroll
      for (int k = 0; k < V; ++k) out.v[k] = from_float<T>(f[k](to_float(xs.v[k]), to_float(dys.v[k])));
      store_pack<V>(dx, r * c + col, out);
    }
  }
  bool packable(int v) const { return pack_aligned(x, v) && pack_aligned(dy, v) && pack_aligned(dx, v); }
};

}  // namespace

void bn_channels_last_train_forward(const Tensor& x, const BatchNormDims& d, BnChannelParams p,
                                    const float* running_mean, const float* running_var, float momentum, float eps,
                                    bool relu, const Tensor* z, Tensor& y, float* mean_out, float* var_out,
                                    float* saved_mean, float* saved_inv_std, cudaStream_t stream) {
  const int64_t m = d.n * d.spatial;
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Partials part = make_partials<T>(d, packs_fit<T>(d, x, nullptr), x.device());
    launch_partials<T>(part, kernels::BnStatsTerms<T>{x.data<T>()}, stream);
    stats_finalize<T><<<static_cast<unsigned>(d.c), kBlock, 0, stream>>>(
        x.data<T>(), part.first.data<float>(), part.second.data<float>(), part.g.chunks, m, running_mean, running_var,
        momentum, eps, mean_out, var_out, saved_mean, saved_inv_std);
    MIX_CUDA_CHECK(cudaGetLastError());
    launch_channel_map<kPackWidth<T>>(m, d.c, stream,
                                      NormalizeMap<T>{x.data<T>(), z ? z->data<T>() : nullptr, y.data<T>(), saved_mean,
                                                      saved_inv_std, p.scale, p.bias, d.c, relu});
  });
}

void bn_channels_last_eval_forward(const Tensor& x, const BatchNormDims& d, BnChannelParams p,
                                   const float* running_mean, const float* running_var, float eps, bool relu,
                                   const Tensor* z, Tensor& y, cudaStream_t stream) {
  if (x.numel() == 0) return;
  const int64_t m = d.n * d.spatial;
  Tensor inv_std = Tensor::empty({d.c}, DType::f32, x.device());
  launch_grid_stride(d.c, stream, RunningInvStd{running_var, eps, inv_std.data<float>()});
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch_channel_map<kPackWidth<T>>(m, d.c, stream,
                                      NormalizeMap<T>{x.data<T>(), z ? z->data<T>() : nullptr, y.data<T>(),
                                                      running_mean, inv_std.data<float>(), p.scale, p.bias, d.c, relu});
  });
}

void bn_channels_last_backward(const Tensor& x, const Tensor& dy, const BatchNormDims& d, BnChannelParams p,
                               const float* saved_mean, const float* saved_inv_std, bool relu, Tensor* dx,
                               float* dscale, float* dbias, cudaStream_t stream) {
  const int64_t m = d.n * d.spatial;
  Tensor means = Tensor::empty({2, d.c}, DType::f32, x.device());  // mean_g, mean_g_xhat
  float* mean_g = means.data<float>();
  float* mean_g_xhat = mean_g + d.c;
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Partials part = make_partials<T>(d, packs_fit<T>(d, x, &dy), x.device());
    launch_partials<T>(
        part, kernels::BnGradTerms<T>{x.data<T>(), dy.data<T>(), saved_mean, saved_inv_std, p.scale, p.bias, relu},
        stream);
    grad_finalize<<<static_cast<unsigned>(d.c), kBlock, 0, stream>>>(
        part.first.data<float>(), part.second.data<float>(), part.g.chunks, m, dscale, dbias, mean_g, mean_g_xhat);
    MIX_CUDA_CHECK(cudaGetLastError());
    if (!dx) return;
    launch_channel_map<kPackWidth<T>>(m, d.c, stream,
                                      GradMap<T>{x.data<T>(), dy.data<T>(), dx->data<T>(), saved_mean, saved_inv_std,
                                                 p.scale, p.bias, mean_g, mean_g_xhat, d.c, relu});
  });
}

}  // namespace mix::cuda
