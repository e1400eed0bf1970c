// The CUDA emulation itself (tests/unit/cuda_emulation.h), on which every
// test_*_emulated.cc rests: its barriers order what they must, its shuffles
// exchange the lanes' values (8-byte ones too), its atomics and
// __syncthreads_or count and answer as the GPU's, a read that no barrier
// orders shows the unwritten value, and a block whose barrier can never fill
// fails instead of hanging.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/unit/cuda_emulation.h"

namespace {

constexpr int kThreads = 256;
constexpr unsigned char kGarbage = emulated::SharedBeyondLaunch::kSharedGarbage;  // run_grid's fill of shared memory

float garbage_float() {
  float f;
  std::memset(&f, kGarbage, sizeof f);
  return f;
}

// Each thread writes its slot of shared memory, then reads its neighbours',
// with or without a barrier between.
std::vector<float> neighbours(bool barrier) {
  std::vector<float> got(2 * kThreads, 0.f);
  emulated::run_grid(
      2, 1,
      [&] {
        auto* shared = reinterpret_cast<float*>(emulated::g_shared);
        const int t = static_cast<int>(threadIdx.x);
        shared[t] = static_cast<float>(t + 1000 * static_cast<int>(blockIdx.x));
        if (barrier) __syncthreads();
        const int next = (t + 1) % kThreads, prev = (t + kThreads - 1) % kThreads;
        const float a = shared[next], b = shared[prev];
        __syncthreads();  // a second round, in the other order
        got[static_cast<size_t>(static_cast<int>(blockIdx.x) * kThreads + t)] = a + b;
      },
      kThreads, kThreads * sizeof(float));
  return got;
}

}  // namespace

TEST_CASE("the emulation's __syncthreads orders shared memory; a missing one shows the unwritten value", "[emulated]") {
  const std::vector<float> ordered = neighbours(true);
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < kThreads; ++t) {
      const float base = 1000.f * static_cast<float>(b);
      const float want =
          base + static_cast<float>((t + 1) % kThreads) + base + static_cast<float>((t + kThreads - 1) % kThreads);
      CHECK(ordered[static_cast<size_t>(b * kThreads + t)] == want);
    }
  // Without the barrier, a thread that runs before its neighbour reads the
  // neighbour's slot unwritten: garbage, not a value that would hide the bug.
  const std::vector<float> racy = neighbours(false);
  int garbage = 0;
  for (float v : racy) garbage += v != v || std::fabs(v) >= std::fabs(garbage_float()) / 2;
  CHECK(garbage > 0);
}

TEST_CASE("the emulation's shuffles exchange the lanes' values within each warp", "[emulated]") {
  std::vector<float> sums(kThreads), firsts(kThreads);
  emulated::run_grid(
      1, 1,
      [&] {
        const int t = static_cast<int>(threadIdx.x);
        float v = static_cast<float>(t);
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        sums[static_cast<size_t>(t)] = v;
        firsts[static_cast<size_t>(t)] = __shfl_sync(0xffffffffu, static_cast<float>(t), 0);
      },
      kThreads);
  for (int t = 0; t < kThreads; ++t) {
    const int w = t / 32;
    CHECK(sums[static_cast<size_t>(t)] == static_cast<float>(32 * 32 * w + 31 * 32 / 2));  // lanes 32w .. 32w + 31
    CHECK(firsts[static_cast<size_t>(t)] == static_cast<float>(32 * w));
  }
}

TEST_CASE("the emulation's 64-bit shuffles, atomics and __syncthreads_or", "[emulated]") {
  // A warp's maximum of 64-bit keys (top1_correct's), a block's count by
  // atomicAdd and its flag by atomicOr, and __syncthreads_or's answer in every
  // thread, called twice so that the second starts from a cleared OR.
  std::vector<unsigned long long> maxima(kThreads);
  std::vector<int> first_or(kThreads), second_or(kThreads);
  unsigned long long count = 0;
  int flag = 0;
  emulated::run_grid(
      1, 1,
      [&] {
        const int t = static_cast<int>(threadIdx.x);
        unsigned long long v = (static_cast<unsigned long long>(t) << 33) | 5u;
        for (int o = 16; o > 0; o >>= 1) {
          const unsigned long long w = __shfl_xor_sync(0xffffffffu, v, o);
          v = w > v ? w : v;
        }
        maxima[static_cast<size_t>(t)] = v;
        atomicAdd(&count, 1ull);
        if (t == 70) atomicOr(&flag, 4);
        first_or[static_cast<size_t>(t)] = __syncthreads_or(t == 70);
        second_or[static_cast<size_t>(t)] = __syncthreads_or(0);
      },
      kThreads);
  for (int t = 0; t < kThreads; ++t) {
    const unsigned long long last_lane = static_cast<unsigned long long>(t / 32 * 32 + 31);
    CHECK(maxima[static_cast<size_t>(t)] == ((last_lane << 33) | 5u));  // above 2^32: all 8 bytes moved
    CHECK(first_or[static_cast<size_t>(t)] == 1);
    CHECK(second_or[static_cast<size_t>(t)] == 0);
  }
  CHECK(count == static_cast<unsigned long long>(kThreads));
  CHECK(flag == 4);
}

TEST_CASE("an emulated block whose barrier some threads never reach fails instead of hanging", "[emulated]") {
  auto skip = [](bool warp) {
    emulated::run_grid(
        1, 1,
        [&] {
          if (threadIdx.x == 3) return;  // this thread never arrives
          if (warp)
            __syncwarp();
          else
            __syncthreads();
        },
        64);
  };
  CHECK_THROWS_AS(skip(false), std::logic_error);
  CHECK_THROWS_AS(skip(true), std::logic_error);
  // And the emulation still runs a sound kernel after a failed one.
  int ran = 0;
  emulated::run_grid(
      1, 1,
      [&] {
        __syncthreads();
        if (threadIdx.x == 0) ++ran;
      },
      64);
  CHECK(ran == 1);
}

#ifndef MIX_ASAN
// A kernel writing float `index` of dynamic shared memory, launched with `floats` of it.
void write_shared_float(int index, int floats) {
  emulated::run_grid(
      1, 2,
      [&] {
        if (threadIdx.x == 0) reinterpret_cast<float*>(emulated::g_shared)[index] = 1.f;
      },
      32, static_cast<size_t>(floats) * sizeof(float));
}

TEST_CASE("an emulated kernel that writes past its launch's dynamic shared memory fails", "[emulated]") {
  write_shared_float(99, 100);  // its last float: fine
  try {
    write_shared_float(100, 100);  // one past it
    FAIL("the write past the launch's 400 bytes went unnoticed");
  } catch (const std::logic_error& e) {
    const std::string what = e.what();
    CHECK(what.find("wrote byte 400 of dynamic shared memory, past the 400 bytes its launch gives it") !=
          std::string::npos);
    CHECK(what.find("(block 0, 0)") != std::string::npos);
  }
  // With no dynamic shared memory asked for (the default), none may be written.
  CHECK_THROWS_AS(emulated::run_grid(
                      1, 1, [&] { emulated::g_shared[0] = 1; }, 32),
                  std::logic_error);
  // A launch asking for more than the emulation holds is refused before it runs.
  CHECK_THROWS_AS(emulated::run_grid(
                      1, 1, [] {}, 32, sizeof emulated::g_shared + 1),
                  std::invalid_argument);
}
#else
// Under AddressSanitizer a write past the launch's bytes would end the
// process at once, as it should; here the bytes past them are checked to be
// poisoned while the kernel runs, and the launch's own not.
TEST_CASE("under ASan, dynamic shared memory past the launch's bytes is poisoned while the kernel runs", "[emulated]") {
  bool last_poisoned = true, past_poisoned = false, first_poisoned_by_default = false;
  emulated::run_grid(
      1, 1,
      [&] {
        if (threadIdx.x != 0) return;
        last_poisoned = __asan_address_is_poisoned(emulated::g_shared + 399) != 0;
        past_poisoned = __asan_address_is_poisoned(emulated::g_shared + 400) != 0;
      },
      32, 400);
  emulated::run_grid(
      1, 1, [&] { first_poisoned_by_default = __asan_address_is_poisoned(emulated::g_shared) != 0; }, 32);
  CHECK_FALSE(last_poisoned);
  CHECK(past_poisoned);
  CHECK(first_poisoned_by_default);
  CHECK_FALSE(__asan_address_is_poisoned(emulated::g_shared + 400));  // and open again after the launch
}
#endif
