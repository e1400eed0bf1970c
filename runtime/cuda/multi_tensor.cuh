#pragma once
// One kernel launch over a list of tensors: the launches and their block
// assignments are planned on the host (runtime/kernels/multi_tensor_plan.h,
// tested on the CPU); this file carries a plan's table to the device as the
// kernel's argument and runs a caller's body on each block's chunk (and gives
// each large tensor a launch of its own). Users: the gradient buckets'
// packing and unpacking (collective/cuda/allreduce_op.cu), the unscale +
// non-finite check (amp/cuda/amp_ops.cu) and the optimizer updates
// (runtime/optim/cuda/updates.cu). The kernels and the host loop over the
// launches are in multi_tensor_kernels.cuh; this file launches them.
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/multi_tensor_kernels.cuh"

namespace mix::cuda {

/// Runs body(slot, begin, end) on `stream` for every chunk of every tensor of
/// the list; all threads of the block call it with the same slot and
/// [begin, end), which the body walks with stride blockDim.x. Empty tensors are skipped; large ones
/// (multi_tensor::launched_alone) get a launch each, the others share launches
/// planned by multi_tensor::plan_launches. Chunks, and tensors, may run in any
/// order, and in several launches: a body must not read what another tensor's
/// body writes.
template <int kPointers, typename Body>
void launch_multi_tensor(const TensorList<kPointers>& list, cudaStream_t stream, const Body& body) {
  static_assert(CUDART_VERSION >= 12010,
                "multi-tensor tables need CUDA 12.1 or newer (kernel parameters over 4 KiB); "
                "with an older toolkit lower multi_tensor::kMaxTensors and kMaxBlocks to fit 4 KiB");
  static_assert(sizeof(MultiTensorArgs<kPointers>) + sizeof(Body) <= 32764,
                "kernel arguments over CUDA's 32,764 bytes: lower multi_tensor::kMaxTensors or kMaxBlocks");
  for_each_multi_tensor_launch(
      list,
      [&](const TensorSlot<kPointers>& slot, int64_t numel, unsigned blocks) {
        single_tensor_kernel<kPointers><<<blocks, kMultiTensorThreads, 0, stream>>>(slot, numel, body);
        MIX_CUDA_CHECK(cudaGetLastError());
      },
      [&](const MultiTensorArgs<kPointers>& args, unsigned blocks) {
        multi_tensor_kernel<kPointers><<<blocks, kMultiTensorThreads, 0, stream>>>(args, body);
        MIX_CUDA_CHECK(cudaGetLastError());
      });
}

}  // namespace mix::cuda
