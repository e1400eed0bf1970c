#pragma once
// The kernels of the elementwise launches (runtime/cuda/launch.cuh): a
// grid-stride loop over f(i), and its packed form, V elements per memory
// instruction. Like runtime/ops/cuda/row_group.cuh it needs no CUDA header, so
// the *_emulated tests run these same kernels, and the maps they launch, on
// the CPU (tests/unit/emulated_map_launch.h).
#include <algorithm>
#include <cstdint>

namespace mix::cuda {

/// Threads per block of the elementwise launches.
inline constexpr int kMapThreads = 256;

/// Blocks for `work` grid-stride items (at most 65535: each thread then loops).
inline unsigned map_blocks(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>((work + kMapThreads - 1) / kMapThreads, 1, 65535));
}

template <typename F>
__global__ void grid_stride_kernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    f(i);
}

// ---- packed maps: V elements per memory instruction -------------------------------------
//
// A warp reading one FP16 value per thread issues 64-byte requests; reading
// eight per thread as one 16-byte load, it issues 512-byte ones, so fewer
// instructions carry the same bytes and more bytes are in flight per thread.
// That is where a bandwidth-bound FP16 map (ReLU, a residual add, a cast)
// gets closer to the memory's speed. The math of each element is the same
// functor call either way, so packed and unpacked results are identical.

/// V consecutive elements of T, aligned so that the GPU moves them with one
/// (or, past 16 bytes, a few) wide load or store.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <int V, typename T>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p, int64_t i) {
  return *reinterpret_cast<const Pack<T, V>*>(p + i);
}
template <int V, typename T>
__device__ __forceinline__ void store_pack(T* p, int64_t i, const Pack<T, V>& v) {
  *reinterpret_cast<Pack<T, V>*>(p + i) = v;
}

/// Whether p can be read or written as Pack<T, V> from element 0 on. Every
/// tensor today starts a cudaMalloc block (256-byte aligned); the check keeps
/// a map correct, unpacked, on memory that does not (a pointer into the
/// middle of a buffer).
template <typename T>
bool pack_aligned(const T* p, int v) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * v) == 0;
}

/// Elements per pack for a map over these element types: 16 bytes of the
/// narrowest (8 halves, 4 floats; a float -> half cast moves 8 of each).
template <typename... T>
inline constexpr int kPackWidth = static_cast<int>(16 / std::min({sizeof(T)...}));

/// Packs [0, n / V) by grid stride, then the n % V elements after them one
/// each, by the first threads of the grid.
template <int V, typename F>
__global__ void packed_kernel(int64_t n, F f) {
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / V;
  for (int64_t p = first; p < packs; p += stride) f.template pack<V>(p * V);
  for (int64_t i = packs * V + first; i < n; i += stride) f(i);
}

}  // namespace mix::cuda
