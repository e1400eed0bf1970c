// top1_correct on CUDA (semantics and checks: runtime/ops/top1_correct.cc).
// A block per row: each thread takes the largest fn::argmax_key over its
// strided share of the row, a block reduction takes the largest of those, and
// thread 0 adds the row's hit to the count with an integer atomic. Integer
// maxima and sums do not depend on order, so the count equals the CPU's on
// every input. Only the first attr valid_classes columns are searched, as on
// the CPU. The kernel is in top1_correct_kernels.cuh.
#include <algorithm>

#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/cuda/top1_correct_kernels.cuh"
#include "runtime/ops/top1_correct.h"

namespace mix::cuda {
namespace {

void top1_correct_cuda(OpContext& ctx) {
  const Tensor logits = ctx.in("Logits");
  const Tensor label = ctx.in("Label");
  check_on_device(ctx, logits, "Logits");
  check_on_device(ctx, label, "Label");
  const Top1Dims d = top1_dims(ctx.op, logits, label);
  Tensor& out = ctx.out("Correct", {1}, DType::i64);
  const cudaStream_t stream = compute_stream(ctx);
  auto* correct = reinterpret_cast<unsigned long long*>(out.data<int64_t>());
  MIX_CUDA_CHECK(cudaMemsetAsync(correct, 0, sizeof(unsigned long long), stream));
  if (d.rows == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(d.rows, int64_t{1} << 20));
  dispatch_floating(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (label.dtype() == DType::i64)
      top1_correct_rows<<<blocks, kBlock, 0, stream>>>(logits.data<T>(), label.data<int64_t>(), d.rows, d.classes,
                                                       d.valid, correct);
    else
      top1_correct_rows<<<blocks, kBlock, 0, stream>>>(logits.data<T>(), label.data<int32_t>(), d.rows, d.classes,
                                                       d.valid, correct);
    MIX_CUDA_CHECK(cudaGetLastError());
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("top1_correct", top1_correct_cuda);

}  // namespace
}  // namespace mix::cuda
