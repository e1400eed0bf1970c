// CUDA kernels of c_allreduce_sum / c_allreduce_max and of the split sum
// c_allreduce_start / c_allreduce_wait (slots, attributes and semantics: the
// CPU ops in collective/allreduce_op.cc). Pre/post scaling is fn::Scale, the
// functor the CPU kernels run; packing and unpacking are device copies on the
// compute stream.
//
// c_allreduce_sum / _max: the bucket is packed on the compute stream, the
// communication stream waits for it with an event (no host sync), the device
// communicator (NCCL) reduces it, and the result is unpacked on the compute
// stream. The NCCL all_reduce returns when the collective has completed.
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

Traffic traffic_of(const OpContext& ctx) {
  return ctx.attr<std::string>("traffic", "control") == "gradients" ? Traffic::gradients : Traffic::control;
}

void allreduce_start_cuda(OpContext& ctx) {
  MIX_CHECK(ctx.env.comm, "op " << ctx.op.type << " needs a communicator (ExecEnv::comm is null)");
  const auto& names = ctx.op.ins("X");
  MIX_CHECK(!names.empty(), ctx.op.type << " of an empty bucket");
  const std::string& buffer_name = ctx.op.out("Buffer");
  MIX_CHECK(!ctx.env.in_flight.count(buffer_name),
            ctx.op.type << ": " << buffer_name << " is already being reduced (started twice without a wait)");
  cuda::DeviceContext& dc = cuda::use_device(ctx.env.device.index);
  const cudaStream_t compute = dc.compute.get();
  const DType dtype = ctx.scope.get(names[0]).dtype();
  int64_t total = 0;
  for (auto& n : names) {
    const Tensor& t = ctx.scope.get(n);
    MIX_CHECK(t.dtype() == dtype, "bucket mixes dtypes: " << n << " is " << dtype_name(t.dtype()) << ", " << names[0]
                                                          << " is " << dtype_name(dtype));
    cuda::check_on_device(ctx, t, "X '" + n + "'");
    total += t.numel();
  }
  Tensor* buffer = nullptr;
  if (names.size() == 1) {
    ctx.scope.set(buffer_name, ctx.scope.get(names[0]).reshaped({total}));  // a view: reduced in place
    buffer = &ctx.scope.get(buffer_name);
  } else {
    buffer = &ctx.out("Buffer", {total}, dtype);  // [total], on the device
    size_t offset = 0;
    for (auto& n : names) {
      const Tensor& t = ctx.scope.get(n);
      cuda::copy_on_stream(static_cast<char*>(buffer->raw()) + offset, t.raw(), t.bytes(), compute);
      offset += t.bytes();
    }
  }
  scale_on_device(buffer->raw(), total, dtype, ctx.attr<float>("prescale", 1.f), compute);
  // The device communicator orders its stream after the compute stream's work
  // so far (the packing and prescale above) and returns without waiting.
  ctx.env.in_flight[buffer_name] =
      ctx.env.comm->all_reduce_start(buffer->raw(), static_cast<size_t>(total), dtype, ReduceOp::sum, traffic_of(ctx));
}

void allreduce_wait_cuda(OpContext& ctx) {
  MIX_CHECK(ctx.env.comm, "op " << ctx.op.type << " needs a communicator (ExecEnv::comm is null)");
  const std::string& buffer_name = ctx.op.in("Buffer");
  auto it = ctx.env.in_flight.find(buffer_name);
  MIX_CHECK(it != ctx.env.in_flight.end(),
            ctx.op.type << ": no all-reduce of " << buffer_name << " is in flight (its c_allreduce_start did not run)");
  const Request request = it->second;
  ctx.env.in_flight.erase(it);
  cuda::DeviceContext& dc = cuda::use_device(ctx.env.device.index);
  const cudaStream_t compute = dc.compute.get();
  // Device communicators return at once, the compute stream waiting for the
  // result on the device: everything below is queued behind it.
  ctx.env.comm->wait(request);
  const Tensor buffer = ctx.scope.get(buffer_name);
  cuda::check_on_device(ctx, buffer, "Buffer '" + buffer_name + "'");
  scale_on_device(buffer.raw(), buffer.numel(), buffer.dtype(), ctx.attr<float>("postscale", 1.f), compute);
  size_t offset = 0;
  for (size_t i = 0; i < ctx.op.outs("Out").size(); ++i) {
    Tensor& t = ctx.out_existing("Out", i);
    MIX_CHECK(t.dtype() == buffer.dtype() && offset + t.bytes() <= buffer.bytes(),
              ctx.op.type << ": " << ctx.op.outs("Out")[i] << " does not fit " << buffer_name);
    if (!t.shares_storage(buffer)) {
      cuda::check_on_device(ctx, t, "Out '" + ctx.op.outs("Out")[i] + "'");
      cuda::copy_on_stream(t.raw(), static_cast<const char*>(buffer.raw()) + offset, t.bytes(), compute);
    }
    offset += t.bytes();
  }
  MIX_CHECK(offset == buffer.bytes(),
            ctx.op.type << ": Out holds " << offset << " bytes but " << buffer_name << " holds " << buffer.bytes());
}

const bool registered =
    OpRegistry::instance().add_cuda_kernel("c_allreduce_sum", [](OpContext& c) { allreduce_cuda(c, ReduceOp::sum); }) &&
    OpRegistry::instance().add_cuda_kernel("c_allreduce_max", [](OpContext& c) { allreduce_cuda(c, ReduceOp::max); }) &&
    OpRegistry::instance().add_cuda_kernel("c_allreduce_start", allreduce_start_cuda) &&
    OpRegistry::instance().add_cuda_kernel("c_allreduce_wait", allreduce_wait_cuda);

}  // namespace
}  // namespace mix::collective
