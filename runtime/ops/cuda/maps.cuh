#pragma once
// The elementwise maps that launch_packed (runtime/cuda/launch.cuh) runs over
// tensors: one functor call per element, or V at once in packs. Like
// row_group.cuh they need no CUDA header, so the *_emulated tests run them on
// the CPU; runtime/ops/cuda/device_ops.cuh includes them.
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/cuda/map_kernels.cuh"
#include "runtime/ops/cuda/kernel_unroll.h"

namespace mix::cuda {

/// out[i] = op(x[i]); out may alias x.
template <typename T, typename Op>
struct UnaryMap {
  const T* x;
  T* out;
  Op op;
  __device__ void operator()(int64_t i) const { out[i] = from_float<T>(op(to_float(x[i]))); }
  template <int V>
  __device__ void pack(int64_t i) const {
    const Pack<T, V> xs = load_pack<V>(x, i);
    Pack<T, V> r;
    MIX_UNROLL
    for (int k = 0; k < V; ++k) r.v[k] = from_float<T>(op(to_float(xs.v[k])));
    store_pack<V>(out, i, r);
  }
  bool packable(int v) const { return pack_aligned(x, v) && pack_aligned(out, v); }
};

/// out[i] = op(a[i], b[i]); out may alias a or b. b may be narrower than a
/// and out (TB half_t or bf16_t beside float: widened on load, exact); packs
/// then hold kPackWidth<T, TB> elements.
template <typename T, typename Op, typename TB = T>
struct BinaryMap {
  const T* a;
  const TB* b;
  T* out;
  Op op;
  __device__ void operator()(int64_t i) const { out[i] = from_float<T>(op(to_float(a[i]), to_float(b[i]))); }
  template <int V>
  __device__ void pack(int64_t i) const {
    const Pack<T, V> as = load_pack<V>(a, i);
    const Pack<TB, V> bs = load_pack<V>(b, i);
    Pack<T, V> r;
    MIX_UNROLL
    for (int k = 0; k < V; ++k) r.v[k] = from_float<T>(op(to_float(as.v[k]), to_float(bs.v[k])));
    store_pack<V>(out, i, r);
  }
  bool packable(int v) const { return pack_aligned(a, v) && pack_aligned(b, v) && pack_aligned(out, v); }
};

/// out[i] = To(x[i]) between floating types: widening is exact, narrowing
/// rounds once to nearest even (from_float), as the CPU's bulk converters.
template <typename From, typename To>
struct FloatCast {
  const From* x;
  To* out;
  __device__ void operator()(int64_t i) const { out[i] = from_float<To>(to_float(x[i])); }
  template <int V>
  __device__ void pack(int64_t i) const {
    const Pack<From, V> xs = load_pack<V>(x, i);
    Pack<To, V> r;
    MIX_UNROLL
    for (int k = 0; k < V; ++k) r.v[k] = from_float<To>(to_float(xs.v[k]));
    store_pack<V>(out, i, r);
  }
  bool packable(int v) const { return pack_aligned(x, v) && pack_aligned(out, v); }
};

}  // namespace mix::cuda
