// launch_scaled_cast_f32_to_f16: out[i] = half(scale * in[i]), fn::Scale then
// the FP16 rounding, through launch_packed (runtime/cuda/launch.cuh).
//
// The step does not call it (the cast op is runtime/ops/cuda/cast_scale_fill.cu).
// It is the first CUDA source of the project, kept as the test hook of the
// packed launcher on raw pointers: tensors from the allocator always start
// aligned, so only raw pointers reach all three of its paths (whole packs
// plus a tail, memory not aligned for packs, fewer elements than a pack);
// tests/unit/test_cuda_cast.cc runs each against the CPU twin.
#include <cuda_runtime.h>

#include "runtime/core/half.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/kernels/functors.h"

namespace mix::cuda {

namespace {
struct ScaledCastToHalf {
  const float* in;
  uint16_t* out;
  fn::Scale op;
  __device__ void operator()(int64_t i) const { out[i] = float_to_half_bits(op(in[i])); }
  template <int V>
  __device__ void pack(int64_t i) const {
    const Pack<float, V> xs = load_pack<V>(in, i);
    Pack<uint16_t, V> r;
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = float_to_half_bits(op(xs.v[k]));
    store_pack<V>(out, i, r);
  }
  bool packable(int v) const { return pack_aligned(in, v) && pack_aligned(out, v); }
};
}  // namespace

// out[i] = half(scale * in[i]) on `stream`, device pointers.
void launch_scaled_cast_f32_to_f16(const float* in, uint16_t* out, size_t n, float scale, cudaStream_t stream) {
  launch_packed<kPackWidth<float, uint16_t>>(static_cast<int64_t>(n), stream,
                                              ScaledCastToHalf{in, out, fn::Scale{scale, 0.f, true}});
}

}  // namespace mix::cuda
