// CUDA kernel of grad_accumulate (runtime/ops/grad_accumulate.h: slots,
// modes, semantics): every (X[i], Accum[i]) in one multi-tensor launch
// (runtime/cuda/multi_tensor.cuh). Each element is widened with to_float
// (exact), added in FP32 with fn::Add as the CPU kernel adds it, and, in
// "finish", rounded once with from_float<T>: the CPU's bits. The body is in
// grad_accumulate_kernels.cuh, which the emulated test runs on the CPU.
#include <string>
#include <vector>

#include "runtime/cuda/multi_tensor.cuh"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/cuda/grad_accumulate_kernels.cuh"
#include "runtime/ops/grad_accumulate.h"

namespace mix::cuda {
namespace {

void grad_accumulate_cuda(OpContext& ctx) {
  const bool finish = grad_accumulate_finishes(ctx.op);
  const std::vector<const Tensor*> xs = ctx.ins("X");
  if (xs.empty()) return;
  const DType dtype = xs[0]->dtype();
  TensorList<2> list;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = *xs[i];
    Tensor& acc = ctx.out_existing("AccumOut", i);
    check_on_device(ctx, x, ctx.op.ins("X")[i]);
    check_on_device(ctx, acc, ctx.op.ins("Accum")[i]);
    MIX_CHECK(x.dtype() == dtype, "grad_accumulate: X " << ctx.op.ins("X")[i] << " is " << dtype_name(x.dtype())
                                                         << ", the first X " << dtype_name(dtype)
                                                         << " (one dtype per op, as a bucket has)");
    MIX_CHECK(acc.dtype() == DType::f32 && acc.numel() == x.numel(),
              "grad_accumulate: " << ctx.op.ins("Accum")[i] << " does not match " << ctx.op.ins("X")[i]);
    // "finish" writes X in place (Out is X); "add" only reads it.
    void* x_ptr = finish ? ctx.out_existing("Out", i).raw() : x.raw();
    list.add({x_ptr, acc.raw()}, x.numel());
  }
  const cudaStream_t stream = compute_stream(ctx);
  dispatch_floating(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (finish)
      launch_multi_tensor<2>(list, stream, AccumulateChunk<T, true>{});
    else
      launch_multi_tensor<2>(list, stream, AccumulateChunk<T, false>{});
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("grad_accumulate", grad_accumulate_cuda);

}  // namespace
}  // namespace mix::cuda
