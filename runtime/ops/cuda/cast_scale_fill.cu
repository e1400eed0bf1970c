// CUDA kernels of cast, scale, fill_constant and fill_like_scalar. Casts
// between floating dtypes widen with half.h's to_float (exact) and round with
// from_float<T>, the conversions the CPU's bulk converters are tested
// bit-identical against; scale runs fn::Scale. The other maps:
// cast_scale_fill_kernels.cuh.
#include <string>

#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/cast_scale_fill_kernels.cuh"
#include "runtime/ops/cuda/device_ops.cuh"

namespace mix::cuda {
namespace {

// ---- launchers -----------------------------------------------------------------------

template <typename From, typename To>
void int_cast(const Tensor& x, Tensor& out, cudaStream_t stream) {
  launch_grid_stride(x.numel(), stream, IntCast<From, To>{x.data<From>(), out.data<To>()});
}

void cast_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");  // by value: Out may replace the scope entry
  check_on_device(ctx, x, "X");
  const DType to = parse_dtype(ctx.attr<std::string>("out_dtype", "f32"));
  Tensor& out = ctx.out("Out", x.shape(), to);
  const cudaStream_t stream = compute_stream(ctx);
  if (x.dtype() == to) return copy_on_stream(out.raw(), x.raw(), x.bytes(), stream);
  if (is_floating(x.dtype()) && is_floating(to)) return float_cast(ctx, x, out);
  if (x.dtype() == DType::i64 && to == DType::i32) return int_cast<int64_t, int32_t>(x, out, stream);
  if (x.dtype() == DType::i32 && to == DType::i64) return int_cast<int32_t, int64_t>(x, out, stream);
  if (x.dtype() == DType::i64 && to == DType::f32) return int_cast<int64_t, float>(x, out, stream);
  MIX_FAIL("cast from " << dtype_name(x.dtype()) << " to " << dtype_name(to) << " is not supported");
}

void scale_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  check_on_device(ctx, x, "X");
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  unary_tensor(
      ctx, x, out,
      fn::Scale{ctx.attr<float>("scale", 1.f), ctx.attr<float>("bias", 0.f), ctx.attr<bool>("bias_after_scale", true)});
}

void fill_constant_cuda(OpContext& ctx) {
  Tensor& out =
      ctx.out("Out", ctx.attr<std::vector<int64_t>>("shape", {1}), parse_dtype(ctx.attr<std::string>("dtype", "f32")));
  const float value = ctx.attr<float>("value", 0.f);
  const cudaStream_t stream = compute_stream(ctx);
  dispatch_floating(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch_grid_stride(out.numel(), stream, FillConstant<T>{out.data<T>(), value});
  });
}

void fill_like_scalar_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  check_on_device(ctx, x, "X");
  MIX_CHECK(x.numel() >= 1, "fill_like_scalar: X is empty");
  Tensor& out = ctx.out("Out", ctx.attr<std::vector<int64_t>>("shape", {1}), x.dtype());
  const cudaStream_t stream = compute_stream(ctx);
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch_grid_stride(out.numel(), stream,
                       FillLikeScalar<T>{x.data<T>(), out.data<T>(), ctx.attr<float>("multiplier", 1.f)});
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("cast", cast_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("scale", scale_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("fill_constant", fill_constant_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("fill_like_scalar", fill_like_scalar_cuda);

}  // namespace
}  // namespace mix::cuda
