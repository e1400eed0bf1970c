// fused_matmul_bias on CUDA (runtime/ops/fused_matmul_bias.cc has the op and
// its CPU twin): one GEMM over the folded batch (Y is a shared weight, so the
// batch is more rows of X), the bias added to its FP32 sums in cuBLASLt's
// epilogue before the one rounding (runtime/cuda/gemm.h, gemm_bias).
#include "runtime/core/check.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/gemm.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/fused_matmul_bias_shapes.h"

namespace mix::cuda {
namespace {

void fused_matmul_bias_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X"), y = ctx.in("Y"), bias = ctx.in("Bias");
  check_on_device(ctx, x, "X");
  check_on_device(ctx, y, "Y");
  check_on_device(ctx, bias, "Bias");
  const MatmulDims d =
      matmul_bias::dims_of(ctx.op, x.shape(), y.shape(), bias.shape(), x.dtype(), y.dtype(), bias.dtype());
  Tensor& out = ctx.out("Out", d.out(), x.dtype());
  gemm_bias(use_device(ctx.env.device.index), ctx.op.attr<bool>("transpose_Y", false), d.count * d.m, d.n, d.k,
            static_cast<float>(ctx.op.attr<double>("alpha", 1.0)), x.raw(), y.raw(), bias.raw(), out.raw(), x.dtype());
}

const bool registered = OpRegistry::instance().add_cuda_kernel("fused_matmul_bias", fused_matmul_bias_cuda);

}  // namespace
}  // namespace mix::cuda
