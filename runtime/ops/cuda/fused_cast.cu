// CUDA kernel of fused_cast (runtime/ops/fused_cast.cc: slots, attributes,
// semantics): every X[i] -> Out[i] in one multi-tensor launch
// (runtime/cuda/multi_tensor.cuh), each element widened with to_float
// (exact) and rounded once with from_float<To>, the conversions cast's CUDA
// kernel uses and the CPU's converters are tested bit-identical against
// (the body: fused_cast_kernels.cuh).
#include <vector>

#include "runtime/cuda/multi_tensor.cuh"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/cuda/fused_cast_kernels.cuh"

namespace mix::cuda {
namespace {

void fused_cast_cuda(OpContext& ctx) {
  const DType to = parse_dtype(ctx.attr<std::string>("out_dtype", "f32"));
  const std::vector<const Tensor*> xs = ctx.ins("X");
  if (xs.empty()) return;
  const DType from = xs[0]->dtype();
  MIX_CHECK(is_floating(from) && is_floating(to),
            "fused_cast: casts floating dtypes only, X is " << dtype_name(from) << ", out_dtype " << dtype_name(to));
  TensorList<2> list;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = *xs[i];
    const std::string& name = ctx.op.ins("X")[i];
    check_on_device(ctx, x, name);
    // One launch takes one pair of dtypes: amp::fuse_param_casts groups casts by theirs.
    MIX_CHECK(x.dtype() == from, "fused_cast: X " << name << " is " << dtype_name(x.dtype()) << ", the first X "
                                                  << dtype_name(from) << " (one source dtype per op)");
    Tensor& out = ctx.out("Out", x.shape(), to, i);
    list.add({x.raw(), out.raw()}, x.numel());
  }
  const cudaStream_t stream = compute_stream(ctx);
  dispatch_floating(from, [&](auto in_tag) {
    using From = decltype(in_tag);
    dispatch_floating(to, [&](auto out_tag) {
      using To = decltype(out_tag);
      launch_multi_tensor<2>(list, stream, FusedCastChunk<From, To>{});
    });
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("fused_cast", fused_cast_cuda);

}  // namespace
}  // namespace mix::cuda
