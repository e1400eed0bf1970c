// CUDA kernel of any_flag (runtime/optim/skip_update.cc): one thread ORs the
// flags on the device.
#include <vector>

#include "runtime/ir/op_registry.h"
#include "runtime/ops/cuda/device_ops.cuh"

namespace mix::cuda {
namespace {

constexpr int kMaxFlags = 8;

struct Flags {
  const int32_t* x[kMaxFlags];
  int n;
};

__global__ void any_flag_kernel(Flags flags, int32_t* out) {
  int32_t any = 0;
  for (int i = 0; i < flags.n; ++i) any |= *flags.x[i] != 0 ? 1 : 0;
  *out = any;
}

void any_flag_cuda(OpContext& ctx) {
  const std::vector<const Tensor*> xs = ctx.ins("X");
  MIX_CHECK(xs.size() <= kMaxFlags, "any_flag: at most " << kMaxFlags << " flags, got " << xs.size());
  Flags flags{};
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
