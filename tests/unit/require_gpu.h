#pragma once
// [cuda] tests call require_gpu() first: in a build without CUDA, or on a
// machine without a visible GPU, the test exits 77, which CTest reports as
// skipped (Catch2 2.x has no SKIP) — never as passed; it returns where the
// CPU stands in for the GPU (gpu_stand_in.h). Also shared GPU test helpers
// (hold_stream).
#include <catch2/catch.hpp>
#include <cstdlib>

#include "tests/unit/gpu_stand_in.h"

#ifdef MIX_HAVE_CUDA
#include <cuda_runtime.h>

#include <chrono>
#include <thread>

#include "runtime/cuda/context.h"
#endif

namespace mix::testing {

inline void require_gpu() {
  if (cpu_stands_in_for_gpu()) return;
#ifndef MIX_HAVE_CUDA
  WARN("this build has no CUDA: skipped");
  std::exit(77);
#else
  if (mix::cuda::device_count() == 0) {
    WARN("no GPU visible: skipped");
    std::exit(77);
  }
#endif
}

/// cuda::set_large_tensor_paths(on) for a scope, and off again after it (also
/// when a check throws): the paths meant for tensors past 32-bit limits, at
/// the sizes of a test.
class LargeTensorPaths {
 public:
  explicit LargeTensorPaths(bool on) { set(on); }
  ~LargeTensorPaths() { set(false); }
  LargeTensorPaths(const LargeTensorPaths&) = delete;
  LargeTensorPaths& operator=(const LargeTensorPaths&) = delete;

 private:
  static void set(bool on) {
#ifdef MIX_HAVE_CUDA
    mix::cuda::set_large_tensor_paths(on);
#else
    (void)on;
#endif
  }
};

#ifdef MIX_HAVE_CUDA
/// Queued with cudaLaunchHostFunc, holds its stream for *seconds (a double that
/// must outlive it): stand-in slow or stuck work, such as a collective waiting
/// for a dead peer, with no kernel to build.
inline void CUDART_CB hold_stream(void* seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(*static_cast<const double*>(seconds)));
}
#endif

}  // namespace mix::testing
