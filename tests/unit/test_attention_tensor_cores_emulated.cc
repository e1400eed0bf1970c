// fused_attention's tensor-core kernels (runtime/ops/cuda/
// fused_attention_tensor_cores_kernels.cuh), their very source, run on the
// CPU by an emulation of the few CUDA features they use, against the double
// reference of test_cuda_fused_attention.cc within the same bounds. It runs
// everywhere, GPU or not, so a change to the kernels' tiling, masking, causal
// ranges or softmax steps is checked on every build; what it cannot check is
// the GPU itself (WMMA's hardware, shared-memory banks, alignment, timing),
// which test_cuda_fused_attention does where a GPU is lent.
//
// The emulation: a block is 128 std::threads (threadIdx, blockIdx thread-local),
// __syncthreads and __syncwarp barriers, __shfl_xor_sync an exchange through
// memory between two warp barriers. A WMMA fragment holds its whole 16 x 16
// matrix in every lane (the kernels never touch fragment elements, so their
// layout does not matter); mma_sync sums in FP32, as the tensor cores' FP32
// accumulation does; every load and store of a fragment is a warp-wide step
// (a warp barrier before and after), as *_sync is on the GPU, and one lane
// stores. Shared memory starts filled with garbage, outputs with NaN, so a
// value read before it was written or never written shows.
#include <catch2/catch.hpp>

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/core/tensor.h"
#include "tests/unit/attention_reference.h"

namespace emulated {

struct Index {
  unsigned x = 0, y = 0, z = 0;
};
thread_local Index thread_index, block_index;

constexpr int kBlockThreads = 128;  // the kernels' kThreads
std::unique_ptr<std::barrier<>> g_block;
std::vector<std::unique_ptr<std::barrier<>>> g_warps;
float g_exchange[kBlockThreads];
alignas(128) unsigned char g_shared[256 * 1024];  // the kernels' largest need is under 124 KiB

int warp_of_thread() { return static_cast<int>(thread_index.x) / 32; }
void block_barrier() { g_block->arrive_and_wait(); }
void warp_barrier() { g_warps[static_cast<size_t>(warp_of_thread())]->arrive_and_wait(); }

// Runs kernel() as a grid of (gx, gy) blocks of kBlockThreads threads, one block at a time.
template <typename Kernel>
void run_grid(unsigned gx, unsigned gy, Kernel kernel) {
  for (unsigned bx = 0; bx < gx; ++bx)
    for (unsigned by = 0; by < gy; ++by) {
      std::memset(g_shared, 0xCD, sizeof g_shared);
      g_block = std::make_unique<std::barrier<>>(kBlockThreads);
      g_warps.clear();
      for (int w = 0; w < kBlockThreads / 32; ++w) g_warps.push_back(std::make_unique<std::barrier<>>(32));
      std::vector<std::thread> threads;
      for (unsigned t = 0; t < kBlockThreads; ++t)
        threads.emplace_back([&, t] {
          thread_index.x = t;
          block_index.x = bx;
          block_index.y = by;
          kernel();
        });
      for (std::thread& t : threads) t.join();
    }
}

}  // namespace emulated

// ---- what the kernels' header asks of its includer --------------------------------------

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define threadIdx emulated::thread_index
#define blockIdx emulated::block_index

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
inline float __shfl_xor_sync(unsigned, float value, int lane_mask) {
  const int me = static_cast<int>(threadIdx.x), other = (me & ~31) | ((me & 31) ^ lane_mask);
  __syncwarp();
  emulated::g_exchange[me] = value;
  __syncwarp();
  const float got = emulated::g_exchange[other];
  __syncwarp();
  return got;
}

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

#include "runtime/ops/cuda/fused_attention_tensor_cores_kernels.cuh"

namespace mix::cuda::attention_tensor_cores {
namespace {
unsigned char* dynamic_shared() { return emulated::g_shared; }
}  // namespace
}  // namespace mix::cuda::attention_tensor_cores

#undef threadIdx
#undef blockIdx

// ---- the test ------------------------------------------------------------------------------

using namespace mix;
using namespace mix::testing;
using mix::testing::attention::Inputs;
using mix::testing::attention::Problem;
namespace kernels = mix::cuda::attention_tensor_cores;

namespace {

const uint16_t* bits_of(const Tensor& t) { return static_cast<const uint16_t*>(t.raw()); }

// Out, LSE and the three gradients of one problem from the emulated kernels;
// the backward takes their own Out (through delta) and LSE, as a training step does.
template <typename T, int kD>
std::map<std::string, Tensor> run_kernels(const Problem& pb, DType dt, const Inputs& in) {
  const Tensor q = to_dtype(in.q, dt), k = to_dtype(in.k, dt), v = to_dtype(in.v, dt), dout = to_dtype(in.r, dt);
  const int64_t groups = pb.groups();
  const attention_rules::AttentionDims a{groups, pb.t, pb.s, pb.d, pb.causal, static_cast<float>(pb.scale())};
  const T unwritten = from_float<T>(NAN);
  std::vector<T> out(static_cast<size_t>(groups * pb.t * pb.d), unwritten), dq(out.size(), unwritten),
      dk(static_cast<size_t>(groups * pb.s * pb.d), unwritten), dv(dk.size(), unwritten);
  std::vector<float> lse(static_cast<size_t>(groups * pb.t), NAN);
  const auto tiles = [](int64_t rows) { return static_cast<unsigned>((rows + kernels::kRows - 1) / kernels::kRows); };
  emulated::run_grid(static_cast<unsigned>(groups), tiles(pb.t), [&] {
    kernels::forward_kernel<T, kD>(bits_of(q), bits_of(k), bits_of(v), out.data(), lse.data(), a);
  });
  // delta = dO . O over each row in FP32, as fused_attention.cu's attention_delta.
  std::vector<float> delta(lse.size());
  const std::vector<float> dout_f = dout.to_floats();
  for (size_t row = 0; row < delta.size(); ++row) {
    float sum = 0.f;
    for (int64_t c = 0; c < pb.d; ++c) {
      const size_t e = row * static_cast<size_t>(pb.d) + static_cast<size_t>(c);
      sum += dout_f[e] * to_float(out[e]);
    }
    delta[row] = sum;
  }
  emulated::run_grid(static_cast<unsigned>(groups), tiles(pb.s), [&] {
    kernels::grad_kv_kernel<T, kD>(bits_of(q), bits_of(k), bits_of(v), bits_of(dout), lse.data(), delta.data(),
                                   dk.data(), dv.data(), a);
  });
  emulated::run_grid(static_cast<unsigned>(groups), tiles(pb.t), [&] {
    kernels::grad_q_kernel<T, kD>(bits_of(q), bits_of(k), bits_of(v), bits_of(dout), lse.data(), delta.data(),
                                  dq.data(), a);
  });
  const auto tensor = [dt](const Shape& shape, const std::vector<T>& values) {
    std::vector<float> f(values.size());
    for (size_t i = 0; i < values.size(); ++i) f[i] = to_float(values[i]);
    return to_dtype(Tensor::from_floats(shape, f), dt);  // exact: the values are already of dtype
  };
  return {{"out", tensor(pb.q_shape(), out)},
          {"lse", Tensor::from_floats(attention_rules::lse_shape(pb.q_shape()), lse)},
          {"dq", tensor(pb.q_shape(), dq)},
          {"dk", tensor(pb.kv_shape(), dk)},
          {"dv", tensor(pb.kv_shape(), dv)}};
}

template <typename T>
std::map<std::string, Tensor> run_for_head_dim(const Problem& pb, DType dt, const Inputs& in) {
  switch (pb.d) {
    case 32:
      return run_kernels<T, 32>(pb, dt, in);
    case 64:
      return run_kernels<T, 64>(pb, dt, in);
    case 96:
      return run_kernels<T, 96>(pb, dt, in);
    default:
      return run_kernels<T, 128>(pb, dt, in);
  }
}

}  // namespace

TEST_CASE("fused_attention's tensor-core kernels, emulated on the CPU, against the double reference",
          "[fused_attention][tensor_cores]") {
  // Several query and key tiles with partial last ones, causal and not,
  // fewer queries than keys, one token, each head dim the kernels take.
  const std::vector<Problem> problems = {
      {{2, 3}, 7, 7, 32, true},    {{1, 2}, 100, 100, 64, true}, {{1, 2}, 20, 45, 64, true},
      {{1, 2}, 20, 45, 64, false}, {{1, 1}, 130, 130, 96, true}, {{1, 1}, 64, 64, 128, false},
      {{1, 1}, 1, 1, 32, true},
  };
  uint64_t seed = 900;
  for (const Problem& pb : problems) {
    for (DType dt : {DType::f16, DType::bf16}) {
      INFO(pb.describe() << ", " << dtype_name(dt));
      const Inputs in = attention::make_inputs(pb, dt, seed += 10);
      const attention::Reference ref = attention::reference_attention(pb, in);
      const auto got = dt == DType::f16 ? run_for_head_dim<half_t>(pb, dt, in) : run_for_head_dim<bf16_t>(pb, dt, in);
      // test_cuda_fused_attention.cc's bounds for the tensor-core kernels.
      const double u = attention::half_ulp(dt), fp32_err = pb.f32_err(), scale = pb.scale();
      attention::expect_near(got.at("out"), ref.out, fp32_err, u, "out",
                             attention::tensor_core_allowance(dt, ref.out_terms, pb.s, 1.0));
      attention::expect_near(got.at("lse"), ref.lse, fp32_err, fp32_err, "lse");
      attention::expect_near(got.at("dq"), ref.dq, 4 * u, u, "dq",
                             attention::tensor_core_allowance(dt, ref.dq_terms, pb.s, 2 * scale));
      attention::expect_near(got.at("dk"), ref.dk, 4 * u, u, "dk",
                             attention::tensor_core_allowance(dt, ref.dk_terms, pb.t, 2 * scale));
      attention::expect_near(got.at("dv"), ref.dv, u, u, "dv",
                             attention::tensor_core_allowance(dt, ref.dv_terms, pb.t, 1.0));
    }
  }
}
