// CUDA kernels of the activations relu, gelu, tanh and their _grad ops: the
// forward and backward functors of runtime/kernels/functors.h, the same ones
// runtime/ops/activation.h runs on the CPU, in grid-stride launches.
#include <string>

#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/device_ops.cuh"

namespace mix::cuda {
namespace {

template <typename Fwd>
void activation_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  check_on_device(ctx, x, "X");
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  unary_tensor(ctx, x, out, Fwd{});
}

// The grad op reads the forward input X (gelu) or output Out (relu, tanh),
// whichever slot activation.h gave it.
template <typename Bwd>
void activation_grad_cuda(OpContext& ctx) {
  const std::string saved_slot = ctx.op.in_or_empty("X").empty() ? "Out" : "X";
  const Tensor saved = ctx.in(saved_slot);
  const Tensor dout = ctx.in("Out@GRAD");
  check_on_device(ctx, saved, saved_slot);
  check_on_device(ctx, dout, "Out@GRAD");
  Tensor& dx = ctx.out("X@GRAD", saved.shape(), dout.dtype());
  binary_tensor(ctx, saved, dout, dx, Bwd{});
}

template <typename Fwd, typename Bwd>
bool register_activation_cuda(const std::string& type) {
  OpRegistry::instance().add_cuda_kernel(type, activation_cuda<Fwd>);
  return OpRegistry::instance().add_cuda_kernel(type + "_grad", activation_grad_cuda<Bwd>);
}

const bool registered = register_activation_cuda<fn::ReluFwd, fn::ReluBwd>("relu") &&
                        register_activation_cuda<fn::GeluFwd, fn::GeluBwd>("gelu") &&
                        register_activation_cuda<fn::TanhFwd, fn::TanhBwd>("tanh");

}  // namespace
}  // namespace mix::cuda
