#pragma once
// Runs emulated multi-tensor launches as launch_multi_tensor
// (runtime/cuda/multi_tensor.cuh) runs them on the GPU: the launches that
// for_each_multi_tensor_launch plans, a tensor alone or tables of many. Include
// it after every header but the kernels' (cuda_emulation.h defines CUDA's
// keywords as macros).
#include "tests/unit/cuda_emulation.h"

#include "runtime/cuda/multi_tensor_kernels.cuh"

namespace mix::testing {

/// The launches an emulated launch_multi_tensor made, to show a test reaches both paths.
struct Launches {
  int alone = 0, shared = 0;
};

/// launch_multi_tensor with each launch run by the emulation.
template <int kPointers, typename Body>
Launches emulated_multi_tensor(const mix::cuda::TensorList<kPointers>& list, const Body& body) {
  Launches n;
  mix::cuda::for_each_multi_tensor_launch(
      list,
      [&](const mix::cuda::TensorSlot<kPointers>& slot, int64_t numel, unsigned blocks) {
        ++n.alone;
        emulated::run_grid(
            blocks, 1, [&] { mix::cuda::single_tensor_kernel<kPointers>(slot, numel, body); },
            mix::cuda::kMultiTensorThreads);
      },
      [&](const mix::cuda::MultiTensorArgs<kPointers>& args, unsigned blocks) {
        ++n.shared;
        emulated::run_grid(
            blocks, 1, [&] { mix::cuda::multi_tensor_kernel<kPointers>(args, body); }, mix::cuda::kMultiTensorThreads);
      });
  return n;
}

}  // namespace mix::testing
