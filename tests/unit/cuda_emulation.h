#pragma once
// Runs CUDA kernel source on the CPU, for the tests that emulate mixtrain's
// hand-written kernels where no GPU is lent (test_*_emulated.cc): the few
// CUDA features those kernels use, and a grid launcher.
//
// A block is 128 threads by default, up to 256, each a fiber (ucontext) of
// one OS thread, run cooperatively: a thread runs until it reaches a barrier
// (__syncthreads, __syncwarp, a shuffle, a WMMA *_sync), then another runs,
// so a barrier costs user-space switches instead of the OS waking 256
// threads. The scheduler lets one warp run ahead of the rest as far as the
// barriers allow (run_block says how), so a missing barrier shows; a block
// whose threads wait at a barrier that can never fill (a __syncthreads some
// threads skip) throws instead of hanging. threadIdx and blockIdx are the
// running thread's, gridDim and blockDim global; __shfl_xor_sync and
// __shfl_sync are an exchange through memory between warp barriers. A WMMA
// fragment holds its whole 16 x 16 matrix in every lane (the kernels never
// touch fragment elements, so their layout does not matter); mma_sync sums in
// FP32, as the tensor cores' FP32 accumulation does; every load and store of a
// fragment is a warp-wide step (a warp barrier before and after), as *_sync is
// on the GPU, and one lane stores. Shared memory starts filled with garbage,
// so a value read before it was written shows. What it cannot check is the GPU
// itself: WMMA's hardware, shared-memory banks, alignment, timing.
//
// Dynamic shared memory is g_shared, of which a launch gives the kernel the
// bytes its host code asks for (run_grid's last argument): a write past them
// fails the launch, and under AddressSanitizer (scripts/sanitize.sh) so does
// a read, as compute-sanitizer's memcheck would on the GPU. A kernel's static
// __shared__ arrays are static arrays here, bounded by ASan's redzones. The
// fibers tell ASan when they switch stacks, so that it follows each one.
//
// Include it before the kernels' header; it defines the CUDA keywords
// (__global__, __device__, threadIdx, ...) as macros, so include every other
// header first.
#include <ucontext.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/core/asan.h"
#include "runtime/core/half.h"

namespace emulated {

struct Index {
  unsigned x = 0, y = 0, z = 0;
};
inline Index thread_index, block_index;  // the running thread's

constexpr int kBlockThreads = 128;                       // the attention kernels' block size, run_grid's default
constexpr int kMaxBlockThreads = 256;                    // the row kernels' (kBlock)
inline uint64_t g_exchange[kMaxBlockThreads];            // a shuffle's values, up to 8 bytes each
inline Index g_grid;                                     // gridDim
inline Index g_block_dim;                                // blockDim
alignas(128) inline unsigned char g_shared[256 * 1024];  // more than any kernel here asks

// A barrier of `expected` threads: the last to arrive opens it (a new
// generation) and goes on; the others wait until the generation moves.
struct Barrier {
  int expected = 0, arrived = 0;
  uint64_t generation = 0;
};

struct Fiber {
  ucontext_t context;
  const Barrier* waiting_on = nullptr;
  uint64_t waiting_generation = 0;
  bool done = false;
};

// Each thread's stack: a kernel's locals, WMMA fragments (1 KiB each) among them.
constexpr size_t kStackBytes = 256 * 1024;

struct Block {
  std::vector<Fiber> fibers;
  std::vector<std::unique_ptr<char[]>> stacks;
  Barrier block_barrier;
  std::vector<Barrier> warp_barriers;
  ucontext_t scheduler;
  int current = 0;
  uint64_t openings = 0;  // barriers opened so far
  const std::function<void()>* kernel = nullptr;
};
inline Block g_run;

// AddressSanitizer follows the switches between the scheduler's stack and
// the fibers' through these (nothing without it): the side switching away
// saves its fake stack (ASan's frames of stack-use-after-return checking)
// and names the stack it goes to; the side arriving restores its own.
struct StackBounds {
  const void* bottom = nullptr;
  size_t size = 0;
};
inline StackBounds g_scheduler_stack;  // as the first fiber to run learns it

// From the scheduler into thread t's fiber, until it gives way or ends.
inline void switch_to_fiber(int t) {
  Fiber& f = g_run.fibers[static_cast<size_t>(t)];
#ifdef MIX_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, g_run.stacks[static_cast<size_t>(t)].get(), kStackBytes);
  swapcontext(&g_run.scheduler, &f.context);
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
  swapcontext(&g_run.scheduler, &f.context);
#endif
}

// From the running fiber back to the scheduler; returns when it is resumed.
inline void switch_to_scheduler(Fiber& me) {
#ifdef MIX_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, g_scheduler_stack.bottom, g_scheduler_stack.size);
  swapcontext(&me.context, &g_run.scheduler);
  __sanitizer_finish_switch_fiber(fake_stack, &g_scheduler_stack.bottom, &g_scheduler_stack.size);
#else
  swapcontext(&me.context, &g_run.scheduler);
#endif
}

inline int warp_of_thread() { return static_cast<int>(thread_index.x) / 32; }

// The running thread arrives at b and, unless it is the last, gives way until b opens.
inline void arrive_and_wait(Barrier& b) {
  const uint64_t generation = b.generation;
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    ++b.generation;
    ++g_run.openings;
    return;
  }
  Fiber& me = g_run.fibers[static_cast<size_t>(g_run.current)];
  me.waiting_on = &b;
  me.waiting_generation = generation;
  switch_to_scheduler(me);
}
inline void block_barrier() { arrive_and_wait(g_run.block_barrier); }
inline void warp_barrier() { arrive_and_wait(g_run.warp_barriers[static_cast<size_t>(warp_of_thread())]); }

inline void run_thread() {
#ifdef MIX_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &g_scheduler_stack.bottom, &g_scheduler_stack.size);
#endif
  (*g_run.kernel)();
  g_run.fibers[static_cast<size_t>(g_run.current)].done = true;
#ifdef MIX_ASAN
  __sanitizer_start_switch_fiber(nullptr, g_scheduler_stack.bottom, g_scheduler_stack.size);  // this fiber ends
#endif
}  // returns to the scheduler (uc_link)

// Thread t's fiber, ready to run the kernel from its start on its own stack.
// (A function of its own: getcontext returns twice, as setjmp does, which
// would leave a caller's loop counter in doubt.)
inline void start_fiber(int t) {
  Fiber& f = g_run.fibers[static_cast<size_t>(t)];
  f = Fiber{};
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = g_run.stacks[static_cast<size_t>(t)].get();
  f.context.uc_stack.ss_size = kStackBytes;
  f.context.uc_link = &g_run.scheduler;
  makecontext(&f.context, run_thread, 0);
}

// Runs one block of the kernel: every thread from its start to its end. The
// scheduler always resumes the first thread, in the block's order, that can
// run: so the first warp runs as far ahead of the others as the barriers let
// it, and a value that some thread reads before the barrier that should
// order it shows unwritten (or already overwritten). Even blocks order their
// threads from 0 up, odd blocks from the last down, so both sides of such a
// race are tried.
inline void run_block() {
  const int threads = static_cast<int>(g_block_dim.x);
  for (int t = 0; t < threads; ++t) start_fiber(t);
  g_run.block_barrier = Barrier{threads};
  for (Barrier& w : g_run.warp_barriers) w = Barrier{32};
  const bool from_first = (block_index.x + block_index.y) % 2 == 0;
  int done = 0;
  bool ran = false;  // in this pass over the threads
  for (int k = 0; done < threads;) {
    if (k == threads) {  // a pass in which no barrier opened
      if (!ran)
        throw std::logic_error(
            "emulated block deadlocked: its threads wait at barriers that the others never reach (a "
            "__syncthreads or a warp's *_sync that not every thread calls)");
      k = 0;
      ran = false;
      continue;
    }
    const int t = from_first ? k : threads - 1 - k;
    Fiber& f = g_run.fibers[static_cast<size_t>(t)];
    if (f.done || (f.waiting_on != nullptr && f.waiting_on->generation == f.waiting_generation)) {
      ++k;
      continue;
    }
    f.waiting_on = nullptr;
    g_run.current = t;
    thread_index.x = static_cast<unsigned>(t);
    const uint64_t openings = g_run.openings;
    switch_to_fiber(t);
    ran = true;
    done += f.done ? 1 : 0;
    // A barrier opened: threads before this one may run again.
    k = g_run.openings != openings ? 0 : k + 1;
  }
}

// g_shared past a launch's dynamic shared memory, for one block: garbage
// that must stay as it is, and under ASan unreadable and unwritable.
class SharedBeyondLaunch {
 public:
  explicit SharedBeyondLaunch(size_t launch_bytes) : from_(launch_bytes) {
    std::memset(g_shared, kSharedGarbage, sizeof g_shared);
    mix::asan_mark(g_shared + from_, sizeof g_shared - from_, false);
  }
  ~SharedBeyondLaunch() { mix::asan_mark(g_shared + from_, sizeof g_shared - from_, true); }
  SharedBeyondLaunch(const SharedBeyondLaunch&) = delete;
  SharedBeyondLaunch& operator=(const SharedBeyondLaunch&) = delete;

  // Throws if the block wrote past the launch's bytes (opening them to look).
  void check_untouched() const {
    mix::asan_mark(g_shared + from_, sizeof g_shared - from_, true);
    for (size_t i = from_; i < sizeof g_shared; ++i)
      if (g_shared[i] != kSharedGarbage)
        throw std::logic_error("emulated kernel wrote byte " + std::to_string(i) +
                               " of dynamic shared memory, past the " + std::to_string(from_) +
                               " bytes its launch gives it (block " + std::to_string(block_index.x) + ", " +
                               std::to_string(block_index.y) + ")");
  }

  static constexpr unsigned char kSharedGarbage = 0xCD;

 private:
  size_t from_;
};

// Runs kernel() as a grid of (gx, gy) blocks of `block_threads` threads (whole
// warps, at most kMaxBlockThreads), one block at a time, with the first
// `dynamic_shared_bytes` of g_shared (none by default, as <<<grid, block>>>),
// refilled with garbage before each block; a block that writes past them throws.
template <typename Kernel>
void run_grid(unsigned gx, unsigned gy, Kernel kernel, int block_threads = kBlockThreads,
              size_t dynamic_shared_bytes = 0) {
  if (block_threads % 32 != 0 || block_threads > kMaxBlockThreads) throw std::invalid_argument("emulated block size");
  if (dynamic_shared_bytes > sizeof g_shared)
    throw std::invalid_argument("emulated launch of " + std::to_string(dynamic_shared_bytes) +
                                " bytes of dynamic shared memory, more than g_shared's " +
                                std::to_string(sizeof g_shared));
  g_grid = {gx, gy, 1};
  g_block_dim = {static_cast<unsigned>(block_threads), 1, 1};
  const std::function<void()> body = kernel;
  g_run.kernel = &body;
  g_run.fibers.resize(static_cast<size_t>(block_threads));
  while (g_run.stacks.size() < static_cast<size_t>(block_threads))
    g_run.stacks.emplace_back(new char[kStackBytes]);  // not zeroed: pages only a deep stack touches stay free
  g_run.warp_barriers.resize(static_cast<size_t>(block_threads / 32));
  for (unsigned bx = 0; bx < gx; ++bx)
    for (unsigned by = 0; by < gy; ++by) {
      block_index = {bx, by, 0};
      const SharedBeyondLaunch beyond(dynamic_shared_bytes);
      run_block();
      beyond.check_untouched();
    }
  g_run.kernel = nullptr;
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
#define __grid_constant__
#define threadIdx emulated::thread_index
#define blockIdx emulated::block_index
#define gridDim emulated::g_grid
#define blockDim emulated::g_block_dim

struct uint2 {
  unsigned x, y;
};
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

// CUDA's device min (an overload per arithmetic type; the kernels call it on int64_t).
template <typename T>
inline T min(T a, T b) {
  return b < a ? b : a;
}

inline void __syncthreads() { emulated::block_barrier(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emulated::warp_barrier(); }
namespace emulated {
// Every lane of the warp posts its value; each takes lane `from`'s.
template <typename V>
V exchange(V value, int from) {
  static_assert(std::is_trivially_copyable_v<V> && sizeof(V) <= sizeof(uint64_t), "a shuffle moves up to 8 bytes");
  const int me = static_cast<int>(thread_index.x);
  warp_barrier();
  std::memcpy(&g_exchange[me], &value, sizeof(V));
  warp_barrier();
  V got;
  std::memcpy(&got, &g_exchange[(me & ~31) | (from & 31)], sizeof(V));
  warp_barrier();
  return got;
}
}  // namespace emulated
template <typename V>
V __shfl_xor_sync(unsigned, V value, int lane_mask) {
  return emulated::exchange(value, (static_cast<int>(threadIdx.x) & 31) ^ lane_mask);
}
template <typename V>
V __shfl_sync(unsigned, V value, int lane) {
  return emulated::exchange(value, lane);
}
// Blocks and their threads take turns on one OS thread, so a plain add is atomic here.
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  *p = old + v;
  return old;
}
inline int atomicOr(int* p, int v) {
  const int old = *p;
  *p = old | v;
  return old;
}
namespace emulated {
inline int g_sync_or = 0;            // the block's OR of __syncthreads_or's predicates
inline unsigned g_sync_or_read = 0;  // threads that have read it
}  // namespace emulated
// A barrier that returns, in every thread, whether any thread's predicate is
// nonzero: each thread ORs its own in, all meet, each reads the result, and
// the last to read clears it before the threads meet again, so the next call
// starts from 0.
inline int __syncthreads_or(int predicate) {
  emulated::g_sync_or |= predicate != 0 ? 1 : 0;
  __syncthreads();
  const int any = emulated::g_sync_or;
  if (++emulated::g_sync_or_read == blockDim.x) {
    emulated::g_sync_or = 0;
    emulated::g_sync_or_read = 0;
  }
  __syncthreads();
  return any;
}
// Rounded as the device intrinsics round: one IEEE operation each (the host
// build contracts nothing into an FMA: no -ffp-contract=fast, no -mfma).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }

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
