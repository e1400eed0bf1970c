#pragma once
// How one CUDA launch covers a list of tensors (the idea of Apex's
// multi_tensor_apply): a step of a ResNet-50 ends with ~160 parameters'
// gradients to unpack, unscale and check, each a few kilobytes to a few
// megabytes. One launch per tensor spends more of the GPU's time starting and
// draining kernels than moving bytes; one launch per list keeps it busy.
//
// Tensors share launches up to kLargeTensor elements each: a ResNet-50's 161
// parameters (the largest 2.4M elements) take two launches a pass. A larger
// tensor (a language model's embedding) gets a launch of its own, with as many
// blocks of kAloneChunk elements as it needs: its launch costs nothing next to
// its bytes, and its small chunks keep every SM busy.
//
// The plan of the shared launches is made on the host, here, in plain C++ so
// that the CPU tests check it: each launch has a table of at most kMaxTensors tensors and at most
// kMaxBlocks blocks, and block b of a launch works on chunk `block_chunk[b]`
// (elements [chunk * kChunk, min((chunk + 1) * kChunk, numel))) of table entry
// `block_tensor[b]`. A tensor too big for what is left of a launch continues in
// the next one. The table travels as the kernel's argument (runtime/cuda/
// multi_tensor.cuh), which bounds the limits: CUDA 12.1 and later take up to
// 32,764 bytes of kernel parameters (Volta and newer), and the largest table,
// four pointers per tensor, stays near 16 KiB. With the 4 KiB of older CUDA
// versions (48 tensors and 320 blocks a launch) the host queued ~40 launches
// for each of a ResNet-50 step's passes over its gradients, a cost the host
// profile (MIX_PROFILE_OPS=host) showed on the GPU check.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mix::multi_tensor {

/// Elements a block works on: 64 per thread of a 256-thread block, enough to
/// hide the block's start on large tensors while a small one still gets a block
/// of its own.
inline constexpr int64_t kChunk = 16384;
inline constexpr int kMaxTensors = 128;
/// 2048 blocks of 256 threads: about two waves on a GPU of 132 SMs (H100, H200), 32M elements a launch.
inline constexpr int kMaxBlocks = 2048;
/// Past this many elements (an eighth of a launch) a tensor is launched alone,
/// in blocks of kAloneChunk (4 elements per thread: every SM kept full).
inline constexpr int64_t kLargeTensor = 256 * kChunk;
inline constexpr int64_t kAloneChunk = 1024;

inline bool launched_alone(int64_t numel) { return numel > kLargeTensor; }
static_assert(kMaxTensors <= 256, "a block's tensor is a uint8_t position in the table");

struct LaunchPlan {
  /// The table: indices into the caller's list (each at most once per launch).
  std::vector<size_t> tensors;
  /// Per block: its tensor as a position in `tensors`, and its chunk of it.
  std::vector<uint8_t> block_tensor;
  std::vector<int32_t> block_chunk;
};

/// The launches covering every element of tensors with these element counts,
/// in list order; empty tensors get no block (and no table entry). Limits are
/// parameters for the tests; the kernels use the defaults.
inline std::vector<LaunchPlan> plan_launches(const std::vector<int64_t>& numels, int64_t chunk = kChunk,
                                             int max_tensors = kMaxTensors, int max_blocks = kMaxBlocks) {
  std::vector<LaunchPlan> launches;
  LaunchPlan cur;
  auto flush = [&] {
    if (!cur.block_chunk.empty()) launches.push_back(std::move(cur));
    cur = LaunchPlan{};
  };
  for (size_t t = 0; t < numels.size(); ++t) {
    const int64_t chunks = (numels[t] + chunk - 1) / chunk;
    for (int64_t c = 0; c < chunks; ++c) {
      if (static_cast<int>(cur.block_chunk.size()) == max_blocks) flush();
      if (cur.tensors.empty() || cur.tensors.back() != t) {
        if (static_cast<int>(cur.tensors.size()) == max_tensors) flush();
        cur.tensors.push_back(t);
      }
      cur.block_tensor.push_back(static_cast<uint8_t>(cur.tensors.size() - 1));
      cur.block_chunk.push_back(static_cast<int32_t>(c));
    }
  }
  flush();
  return launches;
}

}  // namespace mix::multi_tensor
