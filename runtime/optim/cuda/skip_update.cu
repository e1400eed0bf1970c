// CUDA kernel of any_flag (runtime/optim/skip_update.cc): one thread ORs the
// flags on the device (skip_update_kernels.cuh).
#include <vector>

#include "runtime/ir/op_registry.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/optim/cuda/skip_update_kernels.cuh"

namespace mix::cuda {
namespace {

void any_flag_cuda(OpContext& ctx) {
  const std::vector<const Tensor*> xs = ctx.ins("X");
  MIX_CHECK(xs.size() <= kMaxAnyFlags, "any_flag: at most " << kMaxAnyFlags << " flags, got " << xs.size());
  AnyFlags flags{};
  for (size_t i = 0; i < xs.size(); ++i) {
    check_on_device(ctx, *xs[i], ctx.op.ins("X")[i]);
    flags.x[i] = xs[i]->data<int32_t>();
  }
  flags.n = static_cast<int>(xs.size());
  Tensor& out = ctx.out("Out", {1}, DType::i32);
  any_flag_kernel<<<1, 1, 0, compute_stream(ctx)>>>(flags, out.data<int32_t>());
  MIX_CUDA_CHECK(cudaGetLastError());
}

const bool registered = OpRegistry::instance().add_cuda_kernel("any_flag", any_flag_cuda);

}  // namespace
}  // namespace mix::cuda
