#pragma once
// Whether the CPU stands in for cuda:0 in a [cuda] test. No CUDA header here:
// cuda_compare.h, which the emulated kernel tests include too, reads it.
#include <cstdlib>
#include <string>

#include "runtime/core/device.h"

namespace mix::testing {

/// MIX_CUDA_TESTS_ON_CPU=1: [cuda] tests run with the CPU standing in for
/// cuda:0 (cuda_compare.h's kGpu is then the CPU), so their CPU side, what
/// they build and the references they check, runs without a GPU: an op built
/// with attrs the CPU twin refuses, or a reference the CPU misses, shows
/// before a GPU is lent, not during its short lend. CTest runs the cases that
/// can (not tagged [gpu_only]) this way; checks of what only a GPU does (which
/// kernel ran) are skipped by on_real_gpu().
inline bool cpu_stands_in_for_gpu() {
  const char* v = std::getenv("MIX_CUDA_TESTS_ON_CPU");
  return v != nullptr && std::string(v) == "1";
}

inline bool on_real_gpu() { return !cpu_stands_in_for_gpu(); }

/// cuda:0, or the CPU where it stands in for the GPU.
inline Device gpu_or_stand_in() { return on_real_gpu() ? Device{DeviceKind::cuda, 0} : cpu_device(); }

}  // namespace mix::testing
