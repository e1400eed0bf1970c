#pragma once
// any_flag's kernel (skip_update.cu launches it): one thread ORs the flags in
// device memory, so the step's skip decision makes no host round trip. Like
// runtime/ops/cuda/row_group.cuh it needs no CUDA header, so
// tests/unit/test_amp_step_kernels_emulated.cc runs this same source on the CPU.
// Everything here is in an unnamed namespace: skip_update.cu alone includes it.
#include <cstdint>

namespace mix::cuda {
namespace {

/// The most flags one any_flag takes (the outlier detector's and the AMP step's).
inline constexpr int kMaxAnyFlags = 8;

/// The flags' addresses, by value in the kernel's parameters.
struct AnyFlags {
  const int32_t* x[kMaxAnyFlags];
  int n;
};

/// *out = 1 when any flag is nonzero, else 0 (launched as one thread).
__global__ void any_flag_kernel(AnyFlags flags, int32_t* out) {
  int32_t any = 0;
  for (int i = 0; i < flags.n; ++i) any |= *flags.x[i] != 0 ? 1 : 0;
  *out = any;
}

}  // namespace
}  // namespace mix::cuda
