#pragma once
// The elementwise sum X0 + X1 + ... on CUDA, for sum (reduce.cu) and
// fused_sum_relu_grad (fused_add_relu.cu): FP32 additions in input order,
// never contracted, rounded once on store: the CPU's sequence of operations
// (runtime/ops/sum.h), so the results are bit-identical to the CPU's. The
// kernel and its chunks of inputs are in sum_chunks_kernels.cuh.
#include <algorithm>
#include <string>
#include <vector>

#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/cuda/sum_chunks_kernels.cuh"

namespace mix::cuda {

/// out = xs[0] + xs[1] + ... (one dtype and size; out may alias an input),
/// masked by relu's gradient where `relu_out` is given (fused_sum_relu_grad).
inline void sum_into(const OpContext& ctx, const std::vector<Tensor>& xs, Tensor& out, const Tensor* relu_out) {
  MIX_CHECK(!xs.empty(), ctx.op.type << " of no inputs");
  const Tensor& first = xs[0];
  for (size_t k = 0; k < xs.size(); ++k) {
    MIX_CHECK(xs[k].numel() == first.numel() && xs[k].dtype() == first.dtype(),
              ctx.op.type << ": input " << k << " " << dtype_name(xs[k].dtype()) << shape_str(xs[k].shape())
                          << " does not match " << dtype_name(first.dtype()) << shape_str(first.shape()));
  }
  MIX_CHECK(out.numel() == first.numel() && out.dtype() == first.dtype(), ctx.op.type << ": mismatched output");
  MIX_CHECK(!relu_out || (relu_out->numel() == first.numel() && relu_out->dtype() == first.dtype()),
            ctx.op.type << ": Out " << dtype_name(relu_out->dtype()) << shape_str(relu_out->shape())
                        << " does not match the gradient " << dtype_name(first.dtype()) << shape_str(first.shape()));
  const int64_t n = first.numel();
  const cudaStream_t stream = compute_stream(ctx);
  Tensor acc;  // FP32 partial sums between chunks
  float* acc_p = nullptr;
  if (xs.size() > static_cast<size_t>(kSumInputsPerLaunch)) {
    acc = Tensor::empty(first.shape(), DType::f32, ctx.env.device);
    acc_p = acc.data<float>();
  }
  dispatch_floating(first.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for_each_sum_chunk(
        xs.size(), [&](size_t k) { return xs[k].data<T>(); }, acc_p, out.data<T>(),
        relu_out ? relu_out->data<T>() : nullptr,
        [&](const SumChunk<T>& f) { launch_packed<kPackWidth<T>>(n, stream, f); });
  });
}

}  // namespace mix::cuda
