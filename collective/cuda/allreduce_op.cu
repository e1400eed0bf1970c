// CUDA kernels of c_allreduce_sum / c_allreduce_max: the bucket is packed on
// the compute stream, the communication stream waits for it with an event
// (no host sync), the device communicator (NCCL) reduces it, and the result is
// unpacked on the compute stream. Pre/post scaling is fn::Scale, the functor the
// CPU kernel runs. (The NCCL backend still waits for its stream before
// returning; overlapping buckets with backward is the bucketing issue's work.)
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "collective/communicator.h"
#include "runtime/check.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/half.h"
#include "runtime/kernels/functors.h"
#include "runtime/op_registry.h"

namespace mix::collective {
namespace {

void scale_on_device(void* data, int64_t n, DType dtype, float factor, cudaStream_t stream) {
  if (factor == 1.f || n == 0) return;
  const fn::Scale op{factor, 0.f, true};
  switch (dtype) {
    case DType::f32: {
      float* p = static_cast<float*>(data);
      cuda::launch_grid_stride(n, stream, [=] __device__(int64_t i) { p[i] = op(p[i]); });
      return;
    }
    case DType::f16: {
      uint16_t* p = static_cast<uint16_t*>(data);
      cuda::launch_grid_stride(n, stream,
                               [=] __device__(int64_t i) { p[i] = float_to_half_bits(op(half_bits_to_float(p[i]))); });
      return;
    }
    case DType::bf16: {
      uint16_t* p = static_cast<uint16_t*>(data);
      cuda::launch_grid_stride(n, stream,
                               [=] __device__(int64_t i) { p[i] = float_to_bf16_bits(op(bf16_bits_to_float(p[i]))); });
      return;
    }
    default: MIX_FAIL("cannot scale a " << dtype_name(dtype) << " bucket");
  }
}

void allreduce_cuda(OpContext& ctx, ReduceOp op) {
  MIX_CHECK(ctx.env.comm, "op " << ctx.op.type << " needs a communicator (ExecEnv::comm is null)");
  Communicator& comm = *ctx.env.comm;
  const int device = ctx.env.device.index;
  cuda::DeviceContext& dc = cuda::use_device(device);
  const cudaStream_t compute = dc.compute.get();
  const auto& names = ctx.op.ins("X");
  MIX_CHECK(!names.empty(), ctx.op.type << " of an empty bucket");
  const DType dtype = ctx.scope.get(names[0]).dtype();
  const Traffic traffic =
      ctx.attr<std::string>("traffic", "control") == "gradients" ? Traffic::gradients : Traffic::control;
  const float prescale = ctx.attr<float>("prescale", 1.f), postscale = ctx.attr<float>("postscale", 1.f);

  std::vector<Tensor*> parts;
  size_t total = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    Tensor& t = ctx.out_existing("Out", i);
    MIX_CHECK(t.dtype() == dtype, "bucket mixes dtypes: " << names[i] << " is " << dtype_name(t.dtype()));
    parts.push_back(&t);
    total += static_cast<size_t>(t.numel());
  }
  Tensor bucket;
  void* buf = parts[0]->raw();
  if (parts.size() > 1) {
    bucket = Tensor::empty({static_cast<int64_t>(total)}, dtype, ctx.env.device);
    buf = bucket.raw();
    size_t offset = 0;
    for (Tensor* t : parts) {
      MIX_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(buf) + offset, t->raw(), t->bytes(), cudaMemcpyDeviceToDevice,
                                     compute));
      offset += t->bytes();
    }
  }
  scale_on_device(buf, static_cast<int64_t>(total), dtype, prescale, compute);
  // The communication stream starts when the packed bucket is complete.
  cuda::Event packed;
  packed.record(compute);
  packed.wait(dc.comm.get());
  comm.all_reduce(buf, total, dtype, op, traffic);
  cuda::Event reduced;
  reduced.record(dc.comm.get());
  reduced.wait(compute);
  scale_on_device(buf, static_cast<int64_t>(total), dtype, postscale, compute);
  if (parts.size() > 1) {
    size_t offset = 0;
    for (Tensor* t : parts) {
      MIX_CUDA_CHECK(cudaMemcpyAsync(t->raw(), static_cast<char*>(buf) + offset, t->bytes(), cudaMemcpyDeviceToDevice,
                                     compute));
      offset += t->bytes();
    }
  }
}

const bool registered = OpRegistry::instance().add_cuda_kernel(
                            "c_allreduce_sum", [](OpContext& c) { allreduce_cuda(c, ReduceOp::sum); }) &&
                        OpRegistry::instance().add_cuda_kernel(
                            "c_allreduce_max", [](OpContext& c) { allreduce_cuda(c, ReduceOp::max); });

}  // namespace
}  // namespace mix::collective
