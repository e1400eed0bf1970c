// The first CUDA source: the elementwise cast/scale launcher over the shared
// MIX_HD functors. It proves the CUDA side of the build (MIX_WITH_CUDA) and the
// host-device functors compile with nvcc; the full CUDA backend builds on it.
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"
#include "runtime/half.h"
#include "runtime/kernels/functors.h"

namespace mix::cuda {

namespace {
__global__ void f32_to_f16_kernel(const float* in, uint16_t* out, size_t n, float scale) {
  const fn::Scale op{scale, 0.f, true};
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = float_to_half_bits(op(in[i]));
}
}  // namespace

/// out[i] = half(scale * in[i]) on `stream`, device pointers.
void launch_scaled_cast_f32_to_f16(const float* in, uint16_t* out, size_t n, float scale, cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<size_t>((n + threads - 1) / threads, 4096));
  f32_to_f16_kernel<<<blocks, threads, 0, stream>>>(in, out, n, scale);
  MIX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mix::cuda
