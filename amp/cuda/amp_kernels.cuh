#pragma once
// The kernels of the AMP ops (amp_ops.cu's header says what they compute and
// why none makes a host round trip): FoundInfinite's start, the unscale and
// check of each multi-tensor chunk, the loss scale's update in one thread,
// and inject_overflow's write. Like runtime/cuda/multi_tensor_kernels.cuh
// they need no CUDA header, so tests/unit/test_amp_step_kernels_emulated.cc
// runs this same source on the CPU. Everything here is in an unnamed
// namespace: amp_ops.cu alone includes it.
#include <cmath>
#include <cstdint>

#include "amp/loss_scaler.h"
#include "amp/loss_scaling_math.h"
#include "runtime/core/half.h"
#include "runtime/cuda/multi_tensor_kernels.cuh"
#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/scalar_ref.cuh"

namespace mix::amp {
namespace {

using cuda::flag_set;
using cuda::ScalarRef;
using cuda::TensorSlot;

// FoundInfinite = FoundInfiniteIn (when given) or an invalid scale.
struct InitFoundInf {
  int32_t* found;
  ScalarRef prev;
  const float* scale;
  __device__ void operator()(int64_t) const { found[0] = flag_set(prev) || !fn::valid_loss_scale(scale[0]) ? 1 : 0; }
};

// A block's chunk of Out = X / scale (slot pointers: X, Out), raising `found`
// and FoundInfiniteEach[X's index] (`each`, nullable) when it holds an inf or
// NaN: one atomic per block that saw one.
template <typename In, typename Out>
struct UnscaleCheckChunk {
  const float* scale;
  int32_t* found;
  int32_t* each;
  __device__ void operator()(const TensorSlot<2>& s, int64_t begin, int64_t end) const {
    const In* x = static_cast<const In*>(s.ptr[0]);
    Out* out = static_cast<Out*>(s.ptr[1]);
    const fn::UnscaleCheck f = fn::unscale_check_for(scale[0]);
    bool any = false;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) out[i] = from_float<Out>(f(to_float(x[i]), any));
    // Every thread of the block reaches this (multi_tensor_kernel calls the body in all of them).
    if (__syncthreads_or(any) && threadIdx.x == 0) {
      atomicOr(reinterpret_cast<int*>(found), 1);
      if (each) atomicOr(reinterpret_cast<int*>(each + s.index), 1);
    }
  }
};

/// update_loss_scaling in one thread: amp::loss_scaling_step on the state read
/// from device memory, written back (outputs may alias inputs).
struct LossScalingUpdate {
  ScalarRef found_inf;
  const float* scale_in;
  const int64_t* good_in;
  const int64_t* bad_in;
  const int64_t* skipped_in;
  const int64_t* at_min_in;
  float* scale_out;
  int64_t* good_out;
  int64_t* bad_out;
  int64_t* skipped_out;
  int64_t* at_min_out;
  LossScalingParams params;
  __device__ void operator()(int64_t) const {
    // Read everything before writing anything: outputs alias inputs.
    const bool found = flag_set(found_inf);
    LossScalerState s;
    s.scale = scale_in[0];
    s.good_steps = good_in[0];
    s.bad_steps = bad_in[0];
    s.skipped_steps = skipped_in[0];
    s.consecutive_skips_at_min = at_min_in[0];
    loss_scaling_step(params, s, found);  // "stuck" is the host's to report, after the step
    scale_out[0] = s.scale;
    good_out[0] = s.good_steps;
    bad_out[0] = s.bad_steps;
    skipped_out[0] = s.skipped_steps;
    at_min_out[0] = s.consecutive_skips_at_min;
  }
};

// g[0] = +inf, in step `step` only when `now` (ExecEnv::device_step) is given.
template <typename T>
struct WriteInfFirst {
  T* g;
  const int64_t* now;
  int64_t step;
  __device__ void operator()(int64_t) const {
    if (!now || *now == step) g[0] = from_float<T>(INFINITY);
  }
};

}  // namespace
}  // namespace mix::amp
