#pragma once
// The elementwise sum X0 + X1 + ... on CUDA, for sum (reduce.cu) and
// fused_sum_relu_grad (fused_add_relu.cu): FP32 additions in input order,
// never contracted, rounded once on store: the CPU's sequence of operations
// (runtime/ops/sum.h), so the results are bit-identical to the CPU's.
#include <algorithm>
#include <string>
#include <vector>

#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/device_ops.cuh"

namespace mix::cuda {

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
  const T* relu_out;    // fused_sum_relu_grad: 0 where relu_out <= 0, else the sum (fn::ReluBwd); null for sum
  __device__ float last(float a, int64_t i) const { return relu_out ? fn::ReluBwd{}(to_float(relu_out[i]), a) : a; }
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
      out[i] = from_float<T>(last(a, i));
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
      if (relu_out) {
        const Pack<T, V> y = load_pack<V>(relu_out, i);
#pragma unroll
        for (int v = 0; v < V; ++v) a[v] = fn::ReluBwd{}(to_float(y.v[v]), a[v]);
      }
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
                   (!out || pack_aligned(out, v)) && (!relu_out || pack_aligned(relu_out, v));
    for (int k = 0; k < count; ++k) aligned = aligned && pack_aligned(in[k], v);
    return aligned;
  }
};

/// out = xs[0] + xs[1] + ... (one dtype and size; out may alias an input),
/// masked by relu's gradient where `relu_out` is given (fused_sum_relu_grad).
inline void sum_into(const OpContext& ctx, const std::vector<Tensor>& xs, Tensor& out, const Tensor* relu_out) {
  MIX_CHECK(!xs.empty(), ctx.op.type << " of no inputs");
  const Tensor& first = xs[0];
  for (size_t k = 0; k < xs.size(); ++k) {
    MIX_CHECK(xs[k].numel() == first.numel() && xs[k].dtype() == first.dtype(),
              ctx.op.type << ": input " << k << " " << dtype_name(xs[k].dtype()) << shape_str(xs[k].shape())
                          << " does not match " << dtype_name(first.dtype()) << shape_str(first.shape()));
  }
  MIX_CHECK(out.numel() == first.numel() && out.dtype() == first.dtype(), ctx.op.type << ": mismatched output");
  MIX_CHECK(!relu_out || (relu_out->numel() == first.numel() && relu_out->dtype() == first.dtype()),
            ctx.op.type << ": Out " << dtype_name(relu_out->dtype()) << shape_str(relu_out->shape())
                        << " does not match the gradient " << dtype_name(first.dtype()) << shape_str(first.shape()));
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
      f.relu_out = last && relu_out ? relu_out->data<T>() : nullptr;
      launch_packed<kPackWidth<T>>(n, stream, f);
    }
  });
}

}  // namespace mix::cuda
