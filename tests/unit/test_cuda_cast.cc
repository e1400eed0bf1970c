// [cuda] The packed elementwise launcher (runtime/cuda/launch.cuh) on raw
// device pointers, through its test hook launch_scaled_cast_f32_to_f16
// (runtime/cuda/cast_kernels.cu), against the CPU twin: every path it can
// take, and no write outside [0, n).
// Without a GPU (or in a build without CUDA) the test exits 77, which CTest
// reports as skipped, never as passed.
#include <catch2/catch.hpp>

#include "tests/unit/require_gpu.h"
#include <cstdlib>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/core/random.h"
#include "runtime/kernels/functors.h"

#ifdef MIX_HAVE_CUDA
#include <cuda_runtime.h>
namespace mix::cuda {
void launch_scaled_cast_f32_to_f16(const float* in, uint16_t* out, size_t n, float scale, cudaStream_t stream);
}  // namespace mix::cuda
#endif

TEST_CASE("scaled cast kernel matches the CPU twin bit for bit, packed or not", "[cuda]") {
  mix::testing::require_gpu();
#ifdef MIX_HAVE_CUDA
  const size_t max_n = (1 << 20) + 16;
  const float scale = 1024.f;
  std::vector<float> in(max_n);
  mix::Rng rng(3);
  for (auto& v : in) v = static_cast<float>(rng.normal() * 100.0);
  in[5] = 70000.f;  // overflows to inf after scaling either way
  const mix::fn::Scale op{scale, 0.f, true};
  constexpr uint16_t kSentinel = 0x7e5a;  // a NaN pattern no cast of these inputs writes

  float* d_in = nullptr;
  uint16_t* d_out = nullptr;
  REQUIRE(cudaMalloc(&d_in, max_n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(&d_out, max_n * sizeof(uint16_t)) == cudaSuccess);
  REQUIRE(cudaMemcpy(d_in, in.data(), max_n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  struct Case {
    size_t n, in_offset, out_offset;
    const char* path;
  };
  // cudaMalloc memory is 256-byte aligned, so offset 0 packs (8 elements,
  // 32 bytes in, 16 out) and an offset of 1 or 3 elements cannot.
  const Case cases[] = {
      {1 << 20, 0, 0, "whole packs"},
      {(1 << 20) + 5, 0, 0, "whole packs and a tail of 5"},
      {8, 0, 0, "one pack"},
      {5, 0, 0, "fewer elements than a pack"},
      {(1 << 20) + 5, 1, 0, "input not aligned for packs"},
      {(1 << 20) + 5, 0, 3, "output not aligned for packs"},
  };
  for (const Case& c : cases) {
    INFO(c.path << ": n " << c.n << ", offsets " << c.in_offset << " in, " << c.out_offset << " out");
    std::vector<uint16_t> got(max_n, kSentinel);
    REQUIRE(cudaMemcpy(d_out, got.data(), max_n * sizeof(uint16_t), cudaMemcpyHostToDevice) == cudaSuccess);
    mix::cuda::launch_scaled_cast_f32_to_f16(d_in + c.in_offset, d_out + c.out_offset, c.n, scale, nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaMemcpy(got.data(), d_out, max_n * sizeof(uint16_t), cudaMemcpyDeviceToHost) == cudaSuccess);
    // Same functor, same rounding function on both sides: bit-identical, no
    // tolerance. Outside [out_offset, out_offset + n) the sentinel must remain.
    size_t mismatches = 0, stray_writes = 0;
    for (size_t i = 0; i < max_n; ++i) {
      const bool inside = i >= c.out_offset && i < c.out_offset + c.n;
      if (inside)
        mismatches += got[i] != mix::float_to_half_bits(op(in[i - c.out_offset + c.in_offset]));
      else
        stray_writes += got[i] != kSentinel;
    }
    CHECK(mismatches == 0);
    CHECK(stray_writes == 0);
  }
  cudaFree(d_in);
  cudaFree(d_out);
#endif
}
