// The launches of batch_norm's channels-last kernels: what each pass
// computes, batch_norm_channels_last.cuh; the kernels and their launch shapes,
// batch_norm_channels_last_kernels.cuh.
#include "runtime/ops/cuda/batch_norm_channels_last.cuh"

#include "runtime/kernels/bn_channel_sums.h"
#include "runtime/ops/cuda/batch_norm_channels_last_kernels.cuh"
#include "runtime/ops/cuda/device_ops.cuh"

namespace mix::cuda {
namespace {

using kernels::BnSumGeometry;

// A partial-sum launch: its split, and where the sums go ([c, chunks] each).
struct Partials {
  BnSumGeometry g;
  Tensor first, second;  // FP32 [c, chunks]
};

// The split of X [m, c] for T: packs of kPackWidth<T> channels where
// bn_sums_packed allows, else one channel a thread.
template <typename T>
Partials make_partials(const BatchNormDims& d, const Tensor& x, const Tensor* dy) {
  const bool packed = bn_sums_packed<T>(d.c, x.data<T>(), dy ? dy->data<T>() : nullptr);
  const BnSumGeometry g = kernels::bn_sum_geometry(d.n * d.spatial, d.c, packed ? kPackWidth<T> : 1);
  return {g, Tensor::empty({d.c, g.chunks}, DType::f32, x.device()),
          Tensor::empty({d.c, g.chunks}, DType::f32, x.device())};
}

// Launches pass 1 over `part`'s split; T is X's storage type.
template <typename T, typename Terms>
void launch_partials(Partials& part, const Terms& terms, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(part.g.tiles), static_cast<unsigned>(part.g.chunks));
  float* first = part.first.data<float>();
  float* second = part.second.data<float>();
  if (part.g.vec == 1)
    bn_chunk_partials<1><<<grid, kernels::kBnSumThreads, 0, stream>>>(part.g, terms, first, second);
  else
    bn_chunk_partials<kPackWidth<T>><<<grid, kernels::kBnSumThreads, 0, stream>>>(part.g, terms, first, second);
  MIX_CUDA_CHECK(cudaGetLastError());
}

// A pass 3 map over X [rows, c]: column groups of V where bn_map_by_groups
// allows, else f(i) for each element.
template <int V, typename F>
void launch_channel_map(int64_t rows, int64_t c, cudaStream_t stream, F f) {
  if (rows * c == 0) return;
  if (!bn_map_by_groups<V>(c, f)) return launch_grid_stride(rows * c, stream, f);
  const int64_t blocks = bn_column_group_blocks(rows, c / V);
  bn_column_group_kernel<V><<<static_cast<unsigned>(blocks), kMapThreads, 0, stream>>>(rows, c, f);
  MIX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void bn_channels_last_train_forward(const Tensor& x, const BatchNormDims& d, BnChannelParams p,
                                    const float* running_mean, const float* running_var, float momentum, float eps,
                                    bool relu, const Tensor* z, Tensor& y, float* mean_out, float* var_out,
                                    float* saved_mean, float* saved_inv_std, cudaStream_t stream) {
  const int64_t m = d.n * d.spatial;
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Partials part = make_partials<T>(d, x, nullptr);
    launch_partials<T>(part, kernels::BnStatsTerms<T>{x.data<T>()}, stream);
    bn_stats_finalize<T><<<static_cast<unsigned>(d.c), kBlock, 0, stream>>>(
        x.data<T>(), part.first.data<float>(), part.second.data<float>(), part.g.chunks, m, running_mean, running_var,
        momentum, eps, mean_out, var_out, saved_mean, saved_inv_std);
    MIX_CUDA_CHECK(cudaGetLastError());
    launch_channel_map<kPackWidth<T>>(m, d.c, stream,
                                      BnNormalizeMap<T>{x.data<T>(), z ? z->data<T>() : nullptr, y.data<T>(),
                                                        saved_mean, saved_inv_std, p.scale, p.bias, d.c, relu});
  });
}

void bn_channels_last_eval_forward(const Tensor& x, const BatchNormDims& d, BnChannelParams p,
                                   const float* running_mean, const float* running_var, float eps, bool relu,
                                   const Tensor* z, Tensor& y, cudaStream_t stream) {
  if (x.numel() == 0) return;
  const int64_t m = d.n * d.spatial;
  Tensor inv_std = Tensor::empty({d.c}, DType::f32, x.device());
  launch_grid_stride(d.c, stream, BnRunningInvStd{running_var, eps, inv_std.data<float>()});
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch_channel_map<kPackWidth<T>>(
        m, d.c, stream,
        BnNormalizeMap<T>{x.data<T>(), z ? z->data<T>() : nullptr, y.data<T>(), running_mean, inv_std.data<float>(),
                          p.scale, p.bias, d.c, relu});
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
    Partials part = make_partials<T>(d, x, &dy);
    launch_partials<T>(
        part, kernels::BnGradTerms<T>{x.data<T>(), dy.data<T>(), saved_mean, saved_inv_std, p.scale, p.bias, relu},
        stream);
    bn_grad_finalize<<<static_cast<unsigned>(d.c), kBlock, 0, stream>>>(
        part.first.data<float>(), part.second.data<float>(), part.g.chunks, m, dscale, dbias, mean_g, mean_g_xhat);
    MIX_CUDA_CHECK(cudaGetLastError());
    if (!dx) return;
    launch_channel_map<kPackWidth<T>>(m, d.c, stream,
                                      BnGradMap<T>{x.data<T>(), dy.data<T>(), dx->data<T>(), saved_mean, saved_inv_std,
                                                   p.scale, p.bias, mean_g, mean_g_xhat, d.c, relu});
  });
}

}  // namespace mix::cuda
