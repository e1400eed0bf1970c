// CUDA kernels of c_allreduce_sum / c_allreduce_max and of the split sum
// c_allreduce_start / c_allreduce_wait (slots, attributes and semantics: the
// CPU ops in collective/allreduce_op.cc). Pre/post scaling is fn::Scale, the
// functor the CPU kernels run; packing and unpacking are device copies on the
// compute stream.
//
// c_allreduce_sum / _max: the bucket is packed on the compute stream, the
// device communicator (NCCL) reduces it (its stream waits for the compute
// stream on the device, and the call returns when the collective has
// completed), and the result is unpacked on the compute stream.
//
// c_allreduce_start / _wait overlap a gradient bucket's all-reduce with the rest
// of backward. start packs (or, for a one-tensor bucket, views) and prescales on
// the compute stream, then Communicator::all_reduce_start queues the all-reduce
// on the communication stream behind that work and returns at once. wait makes
// the compute stream wait for it on the device (Communicator::wait; nothing
// waits on the host), then postscales and unpacks on the compute stream. The
// packed Buffer is a scope variable allocated on the device, released after the
// wait op; reusing its block is safe in stream order because the compute stream
// has waited for the communication stream's event by then (device_allocator.h).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "collective/allreduce_bucket.h"
#include "collective/communicator.h"
#include "runtime/check.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/half.h"
#include "runtime/kernels/functors.h"
#include "runtime/op_registry.h"
#include "runtime/ops/cuda/device_ops.cuh"

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
  Communicator& comm = comm_of(ctx);
  const cudaStream_t compute = cuda::use_device(ctx.env.device.index).compute.get();
  const BucketShape shape = bucket_shape(ctx, "X");
  const DType dtype = shape.dtype;
  const auto total = static_cast<size_t>(shape.elements);
  const Traffic traffic = traffic_of(ctx);
  const float prescale = ctx.attr<float>("prescale", 1.f), postscale = ctx.attr<float>("postscale", 1.f);

  std::vector<Tensor*> parts;
  for (size_t i = 0; i < ctx.op.outs("Out").size(); ++i) parts.push_back(&ctx.out_existing("Out", i));
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
  // The device communicator orders its stream after the compute stream's work
  // (the packing and prescale above) and returns when the collective has
  // completed, so the unpacking below, queued on the compute stream, sees it.
  comm.all_reduce(buf, total, dtype, op, traffic);
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


void allreduce_start_cuda(OpContext& ctx) {
  const StartBuffer b = start_buffer(ctx);
  const cudaStream_t compute = cuda::use_device(ctx.env.device.index).compute.get();
  cuda::check_on_device(ctx, *b.tensor, "Buffer '" + ctx.op.out("Buffer") + "'");
  if (b.packed) {
    size_t offset = 0;
    for (auto& n : ctx.op.ins("X")) {
      const Tensor& t = ctx.scope.get(n);
      cuda::check_on_device(ctx, t, "X '" + n + "'");
      cuda::copy_on_stream(static_cast<char*>(b.tensor->raw()) + offset, t.raw(), t.bytes(), compute);
      offset += t.bytes();
    }
  }
  scale_on_device(b.tensor->raw(), b.shape.elements, b.shape.dtype, ctx.attr<float>("prescale", 1.f), compute);
  // The device communicator orders its stream after the compute stream's work
  // so far (the packing and prescale above) and returns without waiting.
  start_sum(ctx, b);
}

void allreduce_wait_cuda(OpContext& ctx) {
  const Request request = take_started(ctx);
  const cudaStream_t compute = cuda::use_device(ctx.env.device.index).compute.get();
  // Device communicators return at once, the compute stream waiting for the
  // result on the device: everything below is queued behind it.
  ctx.env.comm->wait(request);
  const std::string& buffer_name = ctx.op.in("Buffer");
  const Tensor buffer = ctx.scope.get(buffer_name);
  cuda::check_on_device(ctx, buffer, "Buffer '" + buffer_name + "'");
  scale_on_device(buffer.raw(), buffer.numel(), buffer.dtype(), ctx.attr<float>("postscale", 1.f), compute);
  const auto unpack = [&](Tensor& t, const std::string& name, size_t offset, bool in_place) {
    if (in_place) return;  // a one-tensor bucket's view
    cuda::check_on_device(ctx, t, "Out '" + name + "'");
    cuda::copy_on_stream(t.raw(), static_cast<const char*>(buffer.raw()) + offset, t.bytes(), compute);
  };
  for_each_slice(ctx, "Out", buffer, buffer_name, unpack);
}

const bool registered =
    OpRegistry::instance().add_cuda_kernel("c_allreduce_sum", [](OpContext& c) { allreduce_cuda(c, ReduceOp::sum); }) &&
    OpRegistry::instance().add_cuda_kernel("c_allreduce_max", [](OpContext& c) { allreduce_cuda(c, ReduceOp::max); }) &&
    OpRegistry::instance().add_cuda_kernel("c_allreduce_start", allreduce_start_cuda) &&
    OpRegistry::instance().add_cuda_kernel("c_allreduce_wait", allreduce_wait_cuda);

}  // namespace
}  // namespace mix::collective
