// CUDA kernels of sum (X0 + X1 + ..., elementwise), mean and mean_grad.
//
// sum adds in FP32 in input order and rounds once on store, exactly the CPU's
// sequence of operations, so its results are bit-identical to the CPU's.
// mean sums in double with a two-pass block reduction (fixed partition of the
// input, fixed trees; no atomics), so it is reproducible run to run; its order
// of additions differs from the CPU's sequential loop, which moves the double
// sum by far less than one float ulp of the mean: the float results agree
// except where the double sum lies within that distance of a rounding boundary
// (then by one ulp). The final division and rounding are fn::mean_from_sum.
#include <vector>

#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/device_ops.cuh"

namespace mix::cuda {
namespace {

// ---- sum -----------------------------------------------------------------------------

/// Inputs one sum kernel takes; longer lists run in chunks through an FP32
/// accumulator, which keeps the order of the additions.
constexpr int kSumInputsPerLaunch = 8;

template <typename T>
struct SumChunk {
  const T* in[kSumInputsPerLaunch];
  int count;
  const float* acc_in;  // null in the first chunk: start from in[0]
  float* acc_out;       // written unless this is the last chunk
  T* out;               // written by the last chunk (may alias an input)
  __device__ void operator()(int64_t i) const {
    float a = acc_in ? acc_in[i] : to_float(in[0][i]);
    // Unrolled to the launch's fixed input count, so that each in[k] is a
    // kernel parameter the compiler addresses directly: a loop to `count`
    // would index the array at run time, from a copy in local memory.
    const int first = acc_in ? 0 : 1;
#pragma unroll
    for (int k = 0; k < kSumInputsPerLaunch; ++k)
      if (k >= first && k < count) a = __fadd_rn(a, to_float(in[k][i]));
    if (out)
      out[i] = from_float<T>(a);
    else
      acc_out[i] = a;
  }
  /// Elements i .. i + V - 1 (launch_packed): the same adds, in the same
  /// order, per element, with each array read and written V values at a time.
  template <int V>
  __device__ void pack(int64_t i) const {
    float a[V];
    if (acc_in) {
      const Pack<float, V> p = load_pack<V>(acc_in, i);
#pragma unroll
      for (int v = 0; v < V; ++v) a[v] = p.v[v];
    } else {
      const Pack<T, V> p = load_pack<V>(in[0], i);
#pragma unroll
      for (int v = 0; v < V; ++v) a[v] = to_float(p.v[v]);
    }
    const int first = acc_in ? 0 : 1;
#pragma unroll
    for (int k = 0; k < kSumInputsPerLaunch; ++k) {
      if (k < first || k >= count) continue;
      const Pack<T, V> p = load_pack<V>(in[k], i);
#pragma unroll
      for (int v = 0; v < V; ++v) a[v] = __fadd_rn(a[v], to_float(p.v[v]));
    }
    if (out) {
      Pack<T, V> r;
#pragma unroll
      for (int v = 0; v < V; ++v) r.v[v] = from_float<T>(a[v]);
      store_pack<V>(out, i, r);
    } else {
      Pack<float, V> r;
#pragma unroll
      for (int v = 0; v < V; ++v) r.v[v] = a[v];
      store_pack<V>(acc_out, i, r);
    }
  }
  bool packable(int v) const {
    bool aligned = (!acc_in || pack_aligned(acc_in, v)) && (!acc_out || pack_aligned(acc_out, v)) &&
                   (!out || pack_aligned(out, v));
    for (int k = 0; k < count; ++k) aligned = aligned && pack_aligned(in[k], v);
    return aligned;
  }
};

void sum_cuda(OpContext& ctx) {
  // By value: Out may alias an input (in-place accumulation) and replace its scope entry.
  std::vector<Tensor> xs;
  for (const Tensor* t : ctx.ins("X")) xs.push_back(*t);
  MIX_CHECK(!xs.empty(), "sum of no inputs");
  const Tensor& first = xs[0];
  for (size_t k = 0; k < xs.size(); ++k) {
    MIX_CHECK(xs[k].numel() == first.numel() && xs[k].dtype() == first.dtype(),
              "sum: input " << k << " " << shape_str(xs[k].shape()) << " does not match " << shape_str(first.shape()));
    check_on_device(ctx, xs[k], "X[" + std::to_string(k) + "]");
  }
  Tensor& out = ctx.out("Out", first.shape(), first.dtype());
  const int64_t n = first.numel();
  const cudaStream_t stream = compute_stream(ctx);
  Tensor acc;  // FP32 partial sums between chunks
  if (xs.size() > static_cast<size_t>(kSumInputsPerLaunch))
    acc = Tensor::empty(first.shape(), DType::f32, ctx.env.device);
  dispatch_floating(first.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (size_t begin = 0; begin < xs.size(); begin += kSumInputsPerLaunch) {
      const size_t end = std::min(xs.size(), begin + kSumInputsPerLaunch);
      SumChunk<T> f{};
      f.count = static_cast<int>(end - begin);
      for (size_t k = begin; k < end; ++k) f.in[k - begin] = xs[k].data<T>();
      f.acc_in = begin == 0 ? nullptr : acc.data<float>();
      const bool last = end == xs.size();
      f.acc_out = last ? nullptr : acc.data<float>();
      f.out = last ? out.data<T>() : nullptr;
      launch_packed<kPackWidth<T>>(n, stream, f);
    }
  });
}

// ---- mean ----------------------------------------------------------------------------

/// Blocks of mean's first pass: a function of numel only (never of the GPU), so
/// the partition, hence the result, is the same on every device.
int mean_blocks(int64_t n) {
  constexpr int64_t kPerBlock = kBlock * 8;
  return static_cast<int>(std::clamp<int64_t>((n + kPerBlock - 1) / kPerBlock, 1, 1024));
}

template <typename T>
__global__ void mean_partial_sums(const T* x, int64_t n, double* partial) {
  __shared__ double shared[kBlock];
  double s = 0.0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kBlock;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kBlock) + threadIdx.x; i < n; i += stride)
    s = __dadd_rn(s, static_cast<double>(to_float(x[i])));
  s = block_reduce(s, shared, AddRnDouble{});
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

template <typename T>
__global__ void mean_finish(const double* partial, int blocks, int64_t n, T* out) {
  __shared__ double shared[kBlock];
  double s = 0.0;
  for (int b = static_cast<int>(threadIdx.x); b < blocks; b += kBlock) s = __dadd_rn(s, partial[b]);
  s = block_reduce(s, shared, AddRnDouble{});
  if (threadIdx.x == 0) out[0] = from_float<T>(fn::mean_from_sum(s, n));
}

void mean_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  check_on_device(ctx, x, "X");
  const int64_t n = x.numel();
  MIX_CHECK(n > 0, "mean of an empty tensor " << shape_str(x.shape()));
  Tensor& out = ctx.out("Out", {1}, x.dtype());
  const cudaStream_t stream = compute_stream(ctx);
  const int blocks = mean_blocks(n);
  // Doubles in an i64 tensor (the same 8 bytes; there is no f64 dtype).
  Tensor partial = Tensor::empty({blocks}, DType::i64, ctx.env.device);
  double* partial_p = static_cast<double*>(partial.raw());
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    mean_partial_sums<T><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(x.data<T>(), n, partial_p);
    MIX_CUDA_CHECK(cudaGetLastError());
    mean_finish<T><<<1, kBlock, 0, stream>>>(partial_p, blocks, n, out.data<T>());
    MIX_CUDA_CHECK(cudaGetLastError());
  });
}

template <typename T>
struct MeanGradFill {
  ScalarRef dout;
  int64_t n;
  T* dx;
  __device__ void operator()(int64_t i) const { dx[i] = from_float<T>(fn::mean_grad_value(load_as_float(dout), n)); }
};

void mean_grad_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  const Tensor dout = ctx.in("Out@GRAD");
  MIX_CHECK(dout.numel() == 1, "mean_grad: Out@GRAD must hold one value, has shape " << shape_str(dout.shape()));
  check_on_device(ctx, dout, "Out@GRAD");
  Tensor& dx = ctx.out("X@GRAD", x.shape(), x.dtype());
  const cudaStream_t stream = compute_stream(ctx);
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch_grid_stride(x.numel(), stream, MeanGradFill<T>{scalar_ref(&dout), x.numel(), dx.data<T>()});
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("sum", sum_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("mean", mean_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("mean_grad", mean_grad_cuda);

}  // namespace
}  // namespace mix::cuda
