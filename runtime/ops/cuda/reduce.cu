// CUDA kernels of sum (X0 + X1 + ..., elementwise), mean and mean_grad.
//
// sum adds in FP32 in input order and rounds once on store, exactly the CPU's
// sequence of operations, so its results are bit-identical to the CPU's
// (sum_chunks.cuh, shared with fused_sum_relu_grad).
// mean sums in double with a two-pass block reduction (fixed partition of the
// input, fixed trees; no atomics), so it is reproducible run to run; its order
// of additions differs from the CPU's sequential loop, which moves the double
// sum by far less than one float ulp of the mean: the float results agree
// except where the double sum lies within that distance of a rounding boundary
// (then by one ulp). The final division and rounding are fn::mean_from_sum.
// mean's kernels are in reduce_kernels.cuh, sum's in sum_chunks_kernels.cuh.
#include <vector>

#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/cuda/reduce_kernels.cuh"
#include "runtime/ops/cuda/sum_chunks.cuh"

namespace mix::cuda {
namespace {

// ---- sum -----------------------------------------------------------------------------

void sum_cuda(OpContext& ctx) {
  // By value: Out may alias an input (in-place accumulation) and replace its scope entry.
  std::vector<Tensor> xs;
  for (const Tensor* t : ctx.ins("X")) xs.push_back(*t);
  MIX_CHECK(!xs.empty(), "sum of no inputs");
  for (size_t k = 0; k < xs.size(); ++k) check_on_device(ctx, xs[k], "X[" + std::to_string(k) + "]");
  Tensor& out = ctx.out("Out", xs[0].shape(), xs[0].dtype());
  sum_into(ctx, xs, out, nullptr);
}

// ---- mean ----------------------------------------------------------------------------

void mean_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  check_on_device(ctx, x, "X");
  const int64_t n = x.numel();
  MIX_CHECK(n > 0, "mean of an empty tensor " << shape_str(x.shape()));
  Tensor& out = ctx.out("Out", {1}, x.dtype());
  const cudaStream_t stream = compute_stream(ctx);
  const int blocks = mean_blocks(n);
  // Doubles in an i64 tensor (the same 8 bytes; there is no f64 dtype).
  Tensor partial = Tensor::empty({blocks}, DType::i64, ctx.env.device);
  double* partial_p = static_cast<double*>(partial.raw());
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    mean_partial_sums<T><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(x.data<T>(), n, partial_p);
    MIX_CUDA_CHECK(cudaGetLastError());
    mean_finish<T><<<1, kBlock, 0, stream>>>(partial_p, blocks, n, out.data<T>());
    MIX_CUDA_CHECK(cudaGetLastError());
  });
}

void mean_grad_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  const Tensor dout = ctx.in("Out@GRAD");
  MIX_CHECK(dout.numel() == 1, "mean_grad: Out@GRAD must hold one value, has shape " << shape_str(dout.shape()));
  check_on_device(ctx, dout, "Out@GRAD");
  Tensor& dx = ctx.out("X@GRAD", x.shape(), x.dtype());
  const cudaStream_t stream = compute_stream(ctx);
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch_grid_stride(x.numel(), stream, MeanGradFill<T>{scalar_ref(&dout), x.numel(), dx.data<T>()});
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("sum", sum_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("mean", mean_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("mean_grad", mean_grad_cuda);

}  // namespace
}  // namespace mix::cuda
