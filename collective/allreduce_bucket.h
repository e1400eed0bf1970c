#pragma once
// What the CPU and CUDA kernels of the bucket all-reduce ops share
// (collective/allreduce_op.cc, collective/cuda/allreduce_op.cu): the bucket's
// checks, c_allreduce_start's Buffer, the ExecEnv::in_flight bookkeeping of a
// started all-reduce, and the walk over the slices of a reduced Buffer. The
// kernels add only the packing, scaling and unpacking on their device.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "collective/communicator.h"
#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"

namespace mix::collective {

inline Traffic traffic_of(const OpContext& ctx) {
  return ctx.attr<std::string>("traffic", "control") == "gradients" ? Traffic::gradients : Traffic::control;
}

/// The communicator the op runs on; an error naming the op when there is none.
inline Communicator& comm_of(const OpContext& ctx) {
  MIX_CHECK(ctx.env.comm, "op " << ctx.op.type << " needs a communicator (ExecEnv::comm is null)");
  return *ctx.env.comm;
}

/// The bucket in `slot`: tensors of one dtype (an error names the first that
/// is not), and their element count.
struct BucketShape {
  DType dtype = DType::f32;
  int64_t elements = 0;
};
inline BucketShape bucket_shape(const OpContext& ctx, const char* slot) {
  const auto& names = ctx.op.ins(slot);
  MIX_CHECK(!names.empty(), ctx.op.type << " of an empty bucket");
  BucketShape b;
  b.dtype = ctx.scope.get(names[0]).dtype();
  for (auto& n : names) {
    const Tensor& t = ctx.scope.get(n);
    MIX_CHECK(t.dtype() == b.dtype, ctx.op.type << ": bucket mixes dtypes: " << n << " is " << dtype_name(t.dtype())
                                                << ", " << names[0] << " is " << dtype_name(b.dtype));
    b.elements += t.numel();
  }
  return b;
}

/// c_allreduce_start's Buffer, after its checks (a communicator, a bucket of
/// one dtype, not already in flight). A one-tensor bucket's Buffer is a view of
/// that tensor, reduced where it lies (`packed` false); otherwise a fresh
/// [elements] output on the op's device for the kernel to pack into.
struct StartBuffer {
  Tensor* tensor = nullptr;
  BucketShape shape;
  bool packed = false;
};
inline StartBuffer start_buffer(OpContext& ctx) {
  comm_of(ctx);
  const std::string& name = ctx.op.out("Buffer");
  MIX_CHECK(!ctx.env.in_flight.count(name),
            ctx.op.type << ": " << name << " is already being reduced (started twice without a wait)");
  StartBuffer b;
  b.shape = bucket_shape(ctx, "X");
  const auto& xs = ctx.op.ins("X");
  if (xs.size() == 1) {
    ctx.scope.set(name, ctx.scope.get(xs[0]).reshaped({b.shape.elements}));
    b.tensor = &ctx.scope.get(name);
  } else {
    b.tensor = &ctx.out("Buffer", {b.shape.elements}, b.shape.dtype);
    b.packed = true;
  }
  return b;
}

/// Starts the sum of c_allreduce_start's Buffer (packed and prescaled by now)
/// and keeps its request under Buffer's name for the wait.
inline void start_sum(OpContext& ctx, const StartBuffer& b) {
  ctx.env.in_flight[ctx.op.out("Buffer")] = comm_of(ctx).all_reduce_start(
      b.tensor->raw(), static_cast<size_t>(b.shape.elements), b.shape.dtype, ReduceOp::sum, traffic_of(ctx));
}

/// c_allreduce_wait's bookkeeping: the request of Buffer's all-reduce, taken
/// out of ExecEnv::in_flight (an error when its start did not run).
inline Request take_started(OpContext& ctx) {
  comm_of(ctx);
  const std::string& name = ctx.op.in("Buffer");
  auto it = ctx.env.in_flight.find(name);
  MIX_CHECK(it != ctx.env.in_flight.end(),
            ctx.op.type << ": no all-reduce of " << name << " is in flight (its c_allreduce_start did not run)");
  const Request request = it->second;
  ctx.env.in_flight.erase(it);
  return request;
}

/// Gives up every all-reduce started and not waited for in `env` (those a
/// failed device recording started: StepGraph::run), so that the step can run
/// again op by op.
inline void forget_started(ExecEnv& env) {
  const auto started = std::move(env.in_flight);  // empty after, whatever a forget throws
  env.in_flight.clear();
  for (const auto& [buffer, request] : started) {
    MIX_CHECK(env.comm, "forget_started: " << started.size() << " all-reduce(s) in flight and no communicator");
    env.comm->forget(request);
  }
}

/// Calls f(out, its name, byte offset in `buffer`, shares_storage) for output i of
/// `slot` in turn, checking that each fits the buffer's dtype and size and that
/// together they fill it exactly. An output that shares storage with the
/// buffer is a one-tensor bucket's view: nothing to copy.
template <typename F>
void for_each_slice(OpContext& ctx, const char* slot, const Tensor& buffer, const std::string& buffer_name, F&& f) {
  size_t offset = 0;
  for (size_t i = 0; i < ctx.op.outs(slot).size(); ++i) {
    Tensor& t = ctx.out_existing(slot, i);
    MIX_CHECK(t.dtype() == buffer.dtype() && offset + t.bytes() <= buffer.bytes(),
              ctx.op.type << ": " << ctx.op.outs(slot)[i] << " does not fit " << buffer_name);
    f(t, ctx.op.outs(slot)[i], offset, t.shares_storage(buffer));
    offset += t.bytes();
  }
  MIX_CHECK(offset == buffer.bytes(), ctx.op.type << ": " << slot << " holds " << offset << " bytes but " << buffer_name
                                                  << " holds " << buffer.bytes());
}

}  // namespace mix::collective
