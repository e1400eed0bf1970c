#pragma once
// The kernel of the elementwise sum X0 + X1 + ... (sum_chunks.cuh's header
// says what it computes) and the host loop that splits a long list of inputs
// into launches. Like row_group.cuh it needs no CUDA header, so
// tests/unit/test_reduce_kernels_emulated.cc runs this same source on the CPU.
#include <algorithm>
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/cuda/map_kernels.cuh"
#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/kernel_unroll.h"

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
    MIX_UNROLL
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
      MIX_UNROLL
      for (int v = 0; v < V; ++v) a[v] = p.v[v];
    } else {
      const Pack<T, V> p = load_pack<V>(in[0], i);
      MIX_UNROLL
      for (int v = 0; v < V; ++v) a[v] = to_float(p.v[v]);
    }
    const int first = acc_in ? 0 : 1;
    MIX_UNROLL
    for (int k = 0; k < kSumInputsPerLaunch; ++k) {
      if (k < first || k >= count) continue;
      const Pack<T, V> p = load_pack<V>(in[k], i);
      MIX_UNROLL
      for (int v = 0; v < V; ++v) a[v] = __fadd_rn(a[v], to_float(p.v[v]));
    }
    if (out) {
      if (relu_out) {
        const Pack<T, V> y = load_pack<V>(relu_out, i);
        MIX_UNROLL
        for (int v = 0; v < V; ++v) a[v] = fn::ReluBwd{}(to_float(y.v[v]), a[v]);
      }
      Pack<T, V> r;
      MIX_UNROLL
      for (int v = 0; v < V; ++v) r.v[v] = from_float<T>(a[v]);
      store_pack<V>(out, i, r);
    } else {
      Pack<float, V> r;
      MIX_UNROLL
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

/// The launches of out = in(0) + in(1) + ... + in(count - 1) (masked by
/// relu's gradient where relu_out is given; out may alias an input): chunks
/// of kSumInputsPerLaunch inputs, handed to launch(SumChunk<T>) in order, with
/// `acc` (as many floats as out has elements) carrying the FP32 sum between
/// them; acc may be null when one chunk holds every input. in(k) gives input
/// k's elements, so the caller's own list needs no copy.
template <typename T, typename Input, typename Launch>
void for_each_sum_chunk(size_t count, Input&& in, float* acc, T* out, const T* relu_out, Launch&& launch) {
  for (size_t begin = 0; begin < count; begin += kSumInputsPerLaunch) {
    const size_t end = std::min(count, begin + static_cast<size_t>(kSumInputsPerLaunch));
    SumChunk<T> f{};
    f.count = static_cast<int>(end - begin);
    for (size_t k = begin; k < end; ++k) f.in[k - begin] = in(k);
    f.acc_in = begin == 0 ? nullptr : acc;
    const bool last = end == count;
    f.acc_out = last ? nullptr : acc;
    f.out = last ? out : nullptr;
    f.relu_out = last ? relu_out : nullptr;
    launch(f);
  }
}

}  // namespace mix::cuda
