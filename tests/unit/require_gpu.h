#pragma once
// [cuda] tests call require_gpu() first: in a build without CUDA, or on a
// machine without a visible GPU, the test exits 77, which CTest reports as
// skipped (Catch2 2.x has no SKIP) — never as passed.
#include <catch2/catch.hpp>
#include <cstdlib>

#ifdef MIX_HAVE_CUDA
#include "runtime/cuda/context.h"
#endif

namespace mix::testing {

inline void require_gpu() {
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

}  // namespace mix::testing
