// CUDA kernels of fused_add_relu and fused_sum_relu_grad (runtime/ops/fused_add_relu.cc):
// fn::AddRelu in the packed binary map every elementwise op uses, and sum's
// chunked FP32 sum (sum_chunks.cuh) with relu's gradient applied before the
// one rounding. Both are bit-identical to the CPU kernels.
#include <string>
#include <vector>

#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/cuda/sum_chunks.cuh"

namespace mix::cuda {
namespace {

void add_relu_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  const Tensor y = ctx.in("Y");
  check_on_device(ctx, x, "X");
  check_on_device(ctx, y, "Y");
  MIX_CHECK(x.shape() == y.shape() && x.dtype() == y.dtype(),
            "fused_add_relu: X " << dtype_name(x.dtype()) << shape_str(x.shape()) << " and Y " << dtype_name(y.dtype())
                                 << shape_str(y.shape()) << " must match");
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  binary_tensor(ctx, x, y, out, fn::AddRelu{});
}

void sum_relu_grad_cuda(OpContext& ctx) {
  const Tensor relu_out = ctx.in("Out");
  check_on_device(ctx, relu_out, "Out");
  std::vector<Tensor> parts;
  for (const Tensor* t : ctx.ins("Out@GRAD")) parts.push_back(*t);
  MIX_CHECK(!parts.empty(), "fused_sum_relu_grad of no gradients");
  for (size_t k = 0; k < parts.size(); ++k) check_on_device(ctx, parts[k], "Out@GRAD[" + std::to_string(k) + "]");
  Tensor& dx = ctx.out("X@GRAD", relu_out.shape(), parts[0].dtype());  // relu_grad's shape: Out's
  sum_into(ctx, parts, dx, &relu_out);
}

const bool registered = OpRegistry::instance().add_cuda_kernel("fused_add_relu", add_relu_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("fused_sum_relu_grad", sum_relu_grad_cuda);

}  // namespace
}  // namespace mix::cuda
