#pragma once
// The bodies of the optimizer ops' multi-tensor launches (sgd, momentum,
// adamw) and increment_step's one-thread map (updates.cu's header says what
// they read from device memory). Like runtime/cuda/multi_tensor_kernels.cuh
// they need no CUDA header, so tests/unit/test_amp_step_kernels_emulated.cc
// runs this same source on the CPU. Everything here is in an unnamed
// namespace: updates.cu alone includes it.
#include <cstdint>

#include "runtime/cuda/multi_tensor_kernels.cuh"
#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/scalar_ref.cuh"

namespace mix::cuda {
namespace {

// One update op updates a group of parameters (runtime/optim/update_op.h); the
// launches cover them all (runtime/cuda/multi_tensor.cuh): up to 128 parameters
// share a launch, only very large ones get one each, so ~160 ResNet-50
// parameters cost two launches instead of 160. Every thread of a block calls the body.

// Slots: param, grad.
struct SgdChunk {
  const float* lr;
  ScalarRef skip;
  float weight_decay;
  __device__ void operator()(const TensorSlot<2>& s, int64_t begin, int64_t end) const {
    if (flag_set(skip)) return;
    float* p = static_cast<float*>(s.ptr[0]);
    const float* g = static_cast<const float*>(s.ptr[1]);
    const fn::SgdUpdate update{*lr, weight_decay};
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) update(p[i], g[i]);
  }
};

// Slots: param, velocity, grad.
struct MomentumChunk {
  const float* lr;
  ScalarRef skip;
  float mu, weight_decay;
  bool nesterov;
  __device__ void operator()(const TensorSlot<3>& s, int64_t begin, int64_t end) const {
    if (flag_set(skip)) return;
    float* p = static_cast<float*>(s.ptr[0]);
    float* velocity = static_cast<float*>(s.ptr[1]);
    const float* g = static_cast<const float*>(s.ptr[2]);
    const fn::MomentumUpdate update{*lr, mu, weight_decay, nesterov};
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) update(p[i], velocity[i], g[i]);
  }
};

// Slots: param, m, v, grad.
struct AdamWChunk {
  const float* lr;
  const int64_t* step;  // optimizer.step, already advanced by increment_step
  ScalarRef skip;
  double beta1, beta2;
  float eps, weight_decay;
  __device__ void operator()(const TensorSlot<4>& s, int64_t begin, int64_t end) const {
    // The step's constants, once per block: two double pows are worth sharing.
    __shared__ fn::AdamWUpdate shared_update;
    __shared__ bool skipped;
    if (threadIdx.x == 0) {
      skipped = flag_set(skip);
      if (!skipped) shared_update = fn::adamw_update_for_step(*lr, beta1, beta2, eps, weight_decay, *step);
    }
    __syncthreads();
    if (skipped) return;
    const fn::AdamWUpdate u = shared_update;
    float* p = static_cast<float*>(s.ptr[0]);
    float* m = static_cast<float*>(s.ptr[1]);
    float* v = static_cast<float*>(s.ptr[2]);
    const float* g = static_cast<const float*>(s.ptr[3]);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) u(p[i], m[i], v[i], g[i]);
  }
};

struct IncrementStep {
  int64_t* step;
  ScalarRef skip;
  __device__ void operator()(int64_t) const {
    if (!flag_set(skip)) step[0] += 1;
  }
};

}  // namespace
}  // namespace mix::cuda
