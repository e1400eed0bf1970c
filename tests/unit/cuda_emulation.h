#pragma once
// Runs CUDA kernel source on the CPU, for the tests that emulate mixtrain's
// hand-written kernels where no GPU is lent (test_*_emulated.cc): the few
// CUDA features those kernels use, and a grid launcher.
//
// A block is 128 std::threads by default, up to 256 (threadIdx, blockIdx
// thread-local, gridDim and blockDim global), __syncthreads and __syncwarp barriers, __shfl_xor_sync and
// __shfl_sync an exchange through memory between warp barriers. A WMMA
// fragment holds its whole 16 x 16 matrix in every lane (the kernels never
// touch fragment elements, so their layout does not matter); mma_sync sums in
// FP32, as the tensor cores' FP32 accumulation does; every load and store of a
// fragment is a warp-wide step (a warp barrier before and after), as *_sync is
// on the GPU, and one lane stores. Shared memory starts filled with garbage,
// so a value read before it was written shows. What it cannot check is the GPU
// itself: WMMA's hardware, shared-memory banks, alignment, timing.
//
// Include it before the kernels' header; it defines the CUDA keywords
// (__global__, __device__, threadIdx, ...) as macros, so include every other
// header first.
#include <barrier>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <vector>

#include "runtime/core/half.h"

namespace emulated {

struct Index {
  unsigned x = 0, y = 0, z = 0;
};
thread_local Index thread_index, block_index;

constexpr int kBlockThreads = 128;     // the attention kernels' block size, run_grid's default
constexpr int kMaxBlockThreads = 256;  // the row kernels' (kBlock)
std::unique_ptr<std::barrier<>> g_block;
std::vector<std::unique_ptr<std::barrier<>>> g_warps;
float g_exchange[kMaxBlockThreads];
Index g_grid;                                     // gridDim
Index g_block_dim;                                // blockDim
alignas(128) unsigned char g_shared[256 * 1024];  // more than any kernel here asks

int warp_of_thread() { return static_cast<int>(thread_index.x) / 32; }
void block_barrier() { g_block->arrive_and_wait(); }
void warp_barrier() { g_warps[static_cast<size_t>(warp_of_thread())]->arrive_and_wait(); }

// Runs kernel() as a grid of (gx, gy) blocks of `block_threads` threads (whole
// warps, at most kMaxBlockThreads), one block at a time.
template <typename Kernel>
void run_grid(unsigned gx, unsigned gy, Kernel kernel, int block_threads = kBlockThreads) {
  if (block_threads % 32 != 0 || block_threads > kMaxBlockThreads) throw std::invalid_argument("emulated block size");
  g_grid = {gx, gy, 1};
  g_block_dim = {static_cast<unsigned>(block_threads), 1, 1};
  g_block = std::make_unique<std::barrier<>>(block_threads);
  g_warps.clear();
  for (int w = 0; w < block_threads / 32; ++w) g_warps.push_back(std::make_unique<std::barrier<>>(32));
  // The block's threads are made once and run the blocks in turn, shared
  // memory refilled with garbage between two of them.
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < static_cast<unsigned>(block_threads); ++t)
    threads.emplace_back([&, t] {
      thread_index.x = t;
      for (unsigned bx = 0; bx < gx; ++bx)
        for (unsigned by = 0; by < gy; ++by) {
          if (t == 0) std::memset(g_shared, 0xCD, sizeof g_shared);
          block_barrier();
          block_index.x = bx;
          block_index.y = by;
          kernel();
          block_barrier();
        }
    });
  for (std::thread& t : threads) t.join();
}

}  // namespace emulated

// ---- what the kernels' header asks of its includer --------------------------------------

#define __global__
#define __device__
// A kernel's static shared array: one per kernel instantiation, which the
// block running holds (blocks run one at a time). Unlike g_shared it is not
// refilled with garbage between blocks.
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define threadIdx emulated::thread_index
#define blockIdx emulated::block_index
#define gridDim emulated::g_grid
#define blockDim emulated::g_block_dim

struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
struct __half {
  uint16_t bits;
};
struct __nv_bfloat16 {
  uint16_t bits;
};
inline float operand_value(__half h) { return mix::half_bits_to_float(h.bits); }
inline float operand_value(__nv_bfloat16 b) { return mix::bf16_bits_to_float(b.bits); }

inline void __syncthreads() { emulated::block_barrier(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emulated::warp_barrier(); }
namespace emulated {
// Every lane of the warp posts its value; each takes lane `from`'s.
inline float exchange(float value, int from) {
  const int me = static_cast<int>(thread_index.x);
  warp_barrier();
  g_exchange[me] = value;
  warp_barrier();
  const float got = g_exchange[(me & ~31) | (from & 31)];
  warp_barrier();
  return got;
}
}  // namespace emulated
inline float __shfl_xor_sync(unsigned, float value, int lane_mask) {
  return emulated::exchange(value, (static_cast<int>(threadIdx.x) & 31) ^ lane_mask);
}
inline float __shfl_sync(unsigned, float value, int lane) { return emulated::exchange(value, lane); }
// Rounded as the device intrinsics round: one IEEE operation each (the host
// build contracts nothing into an FMA: no -ffp-contract=fast, no -mfma).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }

namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  float v[16][16];
};
using Accumulator = fragment<accumulator, 16, 16, 16, float>;

template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, float value) {
  for (auto& row : f.v)
    for (float& x : row) x = value;
}
// Element (i, j) of a 16 x 16 operand at p, row- or column-major.
template <typename Use, typename E, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, E, Layout>& f, const E* p, unsigned ld) {
  __syncwarp();
  for (unsigned i = 0; i < 16; ++i)
    for (unsigned j = 0; j < 16; ++j)
      f.v[i][j] = operand_value(std::is_same_v<Layout, row_major> ? p[i * ld + j] : p[i + j * ld]);
  __syncwarp();
}
inline void load_matrix_sync(Accumulator& f, const float* p, unsigned ld, layout_t) {
  __syncwarp();
  for (unsigned i = 0; i < 16; ++i)
    for (unsigned j = 0; j < 16; ++j) f.v[i][j] = p[i * ld + j];
  __syncwarp();
}
inline void store_matrix_sync(float* p, const Accumulator& f, unsigned ld, layout_t) {
  __syncwarp();
  if (threadIdx.x % 32 == 0)
    for (unsigned i = 0; i < 16; ++i)
      for (unsigned j = 0; j < 16; ++j) p[i * ld + j] = f.v[i][j];
  __syncwarp();
}
template <typename A, typename B>
void mma_sync(Accumulator& d, const A& a, const B& b, const Accumulator& c) {
  Accumulator r;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float sum = c.v[i][j];
      for (int k = 0; k < 16; ++k) sum += a.v[i][k] * b.v[k][j];
      r.v[i][j] = sum;
    }
  d = r;
}
}  // namespace nvcuda::wmma
