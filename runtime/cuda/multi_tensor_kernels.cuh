#pragma once
// The device side of a multi-tensor launch (runtime/cuda/multi_tensor.cuh
// launches it): what a block's body sees of its tensor, the table a launch
// carries, the two kernels, and for_each_multi_tensor_launch, the host loop
// that turns a list of tensors into launches. Like row_group.cuh it needs no
// CUDA header, so the *_emulated tests run these kernels, and the bodies of
// the ops that use them, on the CPU with the same tables.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/kernels/multi_tensor_plan.h"

namespace mix::cuda {

inline constexpr int kMultiTensorThreads = 256;

/// What a block's body sees of its tensor: the caller's pointers for it and
/// its position in the caller's list.
template <int kPointers>
struct TensorSlot {
  void* ptr[kPointers];
  int32_t index;
};

/// The tensors of a multi-tensor launch: tensor i has the pointers ptrs[i]
/// (what they are is the body's business) and numels[i] elements; its index,
/// TensorSlot::index, is i.
template <int kPointers>
struct TensorList {
  std::vector<std::array<void*, kPointers>> ptrs;
  std::vector<int64_t> numels;
  /// Appends a tensor.
  void add(const std::array<void*, kPointers>& p, int64_t numel) { put(numels.size(), p, numel); }
  /// Sets tensor `index`, empty tensors filling any gap before it.
  void put(size_t index, const std::array<void*, kPointers>& p, int64_t numel) {
    if (index >= numels.size()) {
      ptrs.resize(index + 1, std::array<void*, kPointers>{});
      numels.resize(index + 1, 0);
    }
    ptrs[index] = p;
    numels[index] = numel;
  }
};

/// One launch's table (multi_tensor::LaunchPlan, flattened into fixed arrays).
template <int kPointers>
struct MultiTensorArgs {
  void* ptr[kPointers][multi_tensor::kMaxTensors];
  int64_t numel[multi_tensor::kMaxTensors];
  int32_t index[multi_tensor::kMaxTensors];
  int32_t block_chunk[multi_tensor::kMaxBlocks];
  uint8_t block_tensor[multi_tensor::kMaxBlocks];
};

// __grid_constant__: the table is read where the launch put it (constant
// memory), never copied per thread, whatever the indexing below.
template <int kPointers, typename Body>
__global__ void __launch_bounds__(kMultiTensorThreads)
    multi_tensor_kernel(const __grid_constant__ MultiTensorArgs<kPointers> args, Body body) {
  const int t = args.block_tensor[blockIdx.x];
  TensorSlot<kPointers> slot;
  for (int k = 0; k < kPointers; ++k) slot.ptr[k] = args.ptr[k][t];
  slot.index = args.index[t];
  const int64_t begin = static_cast<int64_t>(args.block_chunk[blockIdx.x]) * multi_tensor::kChunk;
  const int64_t end = min(begin + multi_tensor::kChunk, args.numel[t]);
  // Every thread of the block calls the body, so a body may end with a
  // block-wide vote (__syncthreads_or).
  body(slot, begin, end);
}

/// A large tensor's own launch: block b takes chunk b of kAloneChunk elements.
template <int kPointers, typename Body>
__global__ void __launch_bounds__(kMultiTensorThreads)
    single_tensor_kernel(TensorSlot<kPointers> slot, int64_t numel, Body body) {
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * multi_tensor::kAloneChunk;
  body(slot, begin, min(begin + multi_tensor::kAloneChunk, numel));
}

/// The launches that cover `list`, in order: alone(slot, numel, blocks) for
/// each large tensor (multi_tensor::launched_alone: a launch of its own, of
/// `blocks` blocks of kAloneChunk elements), then shared(args, blocks) for
/// each launch that multi_tensor::plan_launches plans for the others. Empty
/// tensors get no block.
template <int kPointers, typename Alone, typename Shared>
void for_each_multi_tensor_launch(const TensorList<kPointers>& list, Alone&& alone, Shared&& shared) {
  const auto& ptrs = list.ptrs;
  const auto& numels = list.numels;
  std::vector<int64_t> rest = numels;  // the large tensors' counts zeroed: no block of theirs in the plan
  for (size_t i = 0; i < numels.size(); ++i) {
    if (!multi_tensor::launched_alone(numels[i])) continue;
    TensorSlot<kPointers> slot{};
    for (int k = 0; k < kPointers; ++k) slot.ptr[k] = ptrs[i][static_cast<size_t>(k)];
    slot.index = static_cast<int32_t>(i);
    const int64_t blocks = (numels[i] + multi_tensor::kAloneChunk - 1) / multi_tensor::kAloneChunk;
    MIX_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "launch_multi_tensor: " << numels[i] << " elements");
    alone(slot, numels[i], static_cast<unsigned>(blocks));
    rest[i] = 0;
  }
  for (const multi_tensor::LaunchPlan& plan : multi_tensor::plan_launches(rest)) {
    MultiTensorArgs<kPointers> args{};
    for (size_t j = 0; j < plan.tensors.size(); ++j) {
      const size_t i = plan.tensors[j];
      for (int k = 0; k < kPointers; ++k) args.ptr[k][j] = ptrs[i][static_cast<size_t>(k)];
      args.numel[j] = numels[i];
      args.index[j] = static_cast<int32_t>(i);
    }
    std::copy(plan.block_chunk.begin(), plan.block_chunk.end(), args.block_chunk);
    std::copy(plan.block_tensor.begin(), plan.block_tensor.end(), args.block_tensor);
    shared(args, static_cast<unsigned>(plan.block_chunk.size()));
  }
}

}  // namespace mix::cuda
