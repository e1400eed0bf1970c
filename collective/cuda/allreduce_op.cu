// CUDA kernels of c_allreduce_sum / c_allreduce_max and of the split sum
// c_allreduce_start / c_allreduce_wait (slots, attributes and semantics: the
// CPU ops in collective/allreduce_op.cc).
//
// Packing, unpacking and pre/post scaling are one pass each, on the compute
// stream: multi-tensor launches (runtime/cuda/multi_tensor.cuh) copy every
// tensor of the bucket, multiplied by the factor with fn::Scale, the functor
// the CPU kernels run (the bodies: bucket_copy_kernels.cuh). Gradients share launches (up to 128 a launch), only
// very large ones get one each; a ResNet-50 bucket of ~50 gradients so costs
// one launch to pack, where a copy per tensor and a scaling pass cost ~50.
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

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "collective/allreduce_bucket.h"
#include "collective/communicator.h"
#include "collective/cuda/bucket_copy_kernels.cuh"
#include "runtime/core/check.h"
#include "runtime/core/half.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/multi_tensor.cuh"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/functors.h"
#include "runtime/ops/cuda/device_ops.cuh"

namespace mix::collective {
namespace {

// The copies of one pass over a bucket (pointers: src, dst).
using Copies = cuda::TensorList<2>;

// Adds src -> dst; a tensor onto itself only when there is a factor to apply.
void add_copy(Copies& copies, const void* src, void* dst, int64_t n, float factor) {
  if (n == 0 || (src == dst && factor == 1.f)) return;
  copies.add({const_cast<void*>(src), dst}, n);
}

// Runs the copies on `stream`, each multiplied by `factor`: a plain copy of
// any dtype when it is 1 (integer buckets of c_allreduce_sum / _max too), a
// floating dtype's scaling otherwise.
void copy_scaled_on_device(const Copies& copies, DType dtype, float factor, cudaStream_t stream) {
  if (copies.numels.empty()) return;
  with_bucket_copy(dtype, factor, [&](auto body) { cuda::launch_multi_tensor<2>(copies, stream, body); });
}

// Copies the bucket's X tensors back to back into `buffer`, times `factor`
// (a one-tensor bucket whose Buffer is its view: scaled where it lies).
void pack_scaled(const OpContext& ctx, void* buffer, DType dtype, float factor, cudaStream_t stream) {
  Copies copies;
  size_t offset = 0;
  for (auto& n : ctx.op.ins("X")) {
    const Tensor& t = ctx.scope.get(n);
    cuda::check_on_device(ctx, t, "X '" + n + "'");
    add_copy(copies, t.raw(), static_cast<char*>(buffer) + offset, t.numel(), factor);
    offset += t.bytes();
  }
  copy_scaled_on_device(copies, dtype, factor, stream);
}

// The reverse: each Out tensor gets its slice of `buffer` times `factor`.
void unpack_scaled(OpContext& ctx, const Tensor& buffer, const std::string& buffer_name, float factor,
                   cudaStream_t stream) {
  Copies copies;
  for_each_slice(ctx, "Out", buffer, buffer_name, [&](Tensor& t, const std::string& name, size_t offset, bool) {
    cuda::check_on_device(ctx, t, "Out '" + name + "'");
    add_copy(copies, static_cast<const char*>(buffer.raw()) + offset, t.raw(), t.numel(), factor);
  });
  copy_scaled_on_device(copies, buffer.dtype(), factor, stream);
}

void allreduce_cuda(OpContext& ctx, ReduceOp op) {
  Communicator& comm = comm_of(ctx);
  const cudaStream_t compute = cuda::use_device(ctx.env.device.index).compute.get();
  const BucketShape shape = bucket_shape(ctx, "X");
  const auto total = static_cast<size_t>(shape.elements);
  const float prescale = ctx.attr<float>("prescale", 1.f), postscale = ctx.attr<float>("postscale", 1.f);
  MIX_CHECK(op == ReduceOp::sum || (prescale == 1.f && postscale == 1.f), "only sums take pre/post scaling");

  // One tensor is reduced where it lies (the Out it is).
  Tensor bucket = ctx.out_existing("Out", 0);
  if (ctx.op.ins("X").size() > 1)
    bucket = Tensor::empty({shape.elements}, shape.dtype, ctx.env.device);
  else
    bucket = bucket.reshaped({shape.elements});
  pack_scaled(ctx, bucket.raw(), shape.dtype, prescale, compute);
  // The device communicator orders its stream after the compute stream's work
  // (the packing and prescale above) and returns when the collective has
  // completed, so the unpacking below, queued on the compute stream, sees it.
  comm.all_reduce(bucket.raw(), total, shape.dtype, op, traffic_of(ctx));
  unpack_scaled(ctx, bucket, "the packed bucket", postscale, compute);
}

void allreduce_start_cuda(OpContext& ctx) {
  const StartBuffer b = start_buffer(ctx);
  const cudaStream_t compute = cuda::use_device(ctx.env.device.index).compute.get();
  cuda::check_on_device(ctx, *b.tensor, "Buffer '" + ctx.op.out("Buffer") + "'");
  pack_scaled(ctx, b.tensor->raw(), b.shape.dtype, ctx.attr<float>("prescale", 1.f), compute);
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
  unpack_scaled(ctx, buffer, buffer_name, ctx.attr<float>("postscale", 1.f), compute);
}

const bool registered =
    OpRegistry::instance().add_cuda_kernel("c_allreduce_sum", [](OpContext& c) { allreduce_cuda(c, ReduceOp::sum); }) &&
    OpRegistry::instance().add_cuda_kernel("c_allreduce_max", [](OpContext& c) { allreduce_cuda(c, ReduceOp::max); }) &&
    OpRegistry::instance().add_cuda_kernel("c_allreduce_start", allreduce_start_cuda) &&
    OpRegistry::instance().add_cuda_kernel("c_allreduce_wait", allreduce_wait_cuda);

}  // namespace
}  // namespace mix::collective
