// c_allreduce_sum / c_allreduce_max: in-place all-reduce of a bucket of
// tensors of one dtype through the program's communicator. The bucket is
// packed into one contiguous buffer so that it costs one collective call.
// Sum buckets take Horovod/Apex-style scaling: multiply by `prescale` before
// the sum (on pack) and by `postscale` after it (on unpack), rounding to the
// bucket's dtype each time as a GPU kernel would.
//
// c_allreduce_start / c_allreduce_wait: the same sum split in two, so that a
// gradient bucket's all-reduce runs while backward goes on (the data-parallel
// pass puts the start right after the bucket's last gradient is written and
// the wait after backward).
//   c_allreduce_start  X: the bucket's tensors -> Buffer: [total] of their dtype,
//                      packed and multiplied by `prescale`; the all-reduce is
//                      started on it (Communicator::all_reduce_start) and its
//                      request kept in ExecEnv::in_flight under Buffer's name.
//                      A one-tensor bucket's Buffer is a view of that tensor:
//                      no copy, reduced where it lies.
//   c_allreduce_wait   Buffer -> Out: the bucket's tensors, unpacked from the
//                      reduced Buffer and multiplied by `postscale`.
// Nothing may touch X between the two; the pass places them so.
#include <cstring>
#include <vector>

#include "collective/communicator.h"
#include "runtime/check.h"
#include "runtime/half.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"
#include "runtime/op_registry.h"

namespace mix::collective {
namespace {

void scale_in_place(void* data, int64_t n, DType dtype, float factor) {
  if (factor == 1.f) return;
  cpu::dispatch_floating(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(data);
    cpu::unary(p, p, n, fn::Scale{factor, 0.f, true});
  });
}

void allreduce_cpu(OpContext& ctx, ReduceOp op) {
  MIX_CHECK(ctx.env.comm, "op " << ctx.op.type << " needs a communicator (ExecEnv::comm is null)");
  Communicator& comm = *ctx.env.comm;
  const auto& names = ctx.op.ins("X");
  MIX_CHECK(!names.empty(), ctx.op.type << " of an empty bucket");
  const DType dtype = ctx.scope.get(names[0]).dtype();
  const Traffic traffic = ctx.attr<std::string>("traffic", "control") == "gradients" ? Traffic::gradients : Traffic::control;
  const float prescale = ctx.attr<float>("prescale", 1.f), postscale = ctx.attr<float>("postscale", 1.f);
  MIX_CHECK(op == ReduceOp::sum || (prescale == 1.f && postscale == 1.f), "only sums take pre/post scaling");

  size_t total = 0;
  for (auto& n : names) {
    const Tensor& t = ctx.scope.get(n);
    MIX_CHECK(t.dtype() == dtype, "bucket mixes dtypes: " << n << " is " << dtype_name(t.dtype()) << ", "
                                                          << names[0] << " is " << dtype_name(dtype));
    total += static_cast<size_t>(t.numel());
  }
  const size_t esize = dtype_size(dtype);
  if (names.size() == 1) {
    // One tensor: reduce it where it lies.
    Tensor& t = ctx.out_existing("Out", 0);
    scale_in_place(t.raw(), t.numel(), dtype, prescale);
    comm.all_reduce(t.raw(), total, dtype, op, traffic);
    scale_in_place(t.raw(), t.numel(), dtype, postscale);
    return;
  }
  thread_local std::vector<unsigned char> bucket;
  bucket.resize(total * esize);
  size_t offset = 0;
  for (auto& n : names) {
    const Tensor& t = ctx.scope.get(n);
    std::memcpy(bucket.data() + offset, t.raw(), t.bytes());
    offset += t.bytes();
  }
  scale_in_place(bucket.data(), static_cast<int64_t>(total), dtype, prescale);
  comm.all_reduce(bucket.data(), total, dtype, op, traffic);
  scale_in_place(bucket.data(), static_cast<int64_t>(total), dtype, postscale);
  offset = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    Tensor& t = ctx.out_existing("Out", i);
    std::memcpy(t.raw(), bucket.data() + offset, t.bytes());
    offset += t.bytes();
  }
}

Traffic traffic_of(const OpContext& ctx) {
  return ctx.attr<std::string>("traffic", "control") == "gradients" ? Traffic::gradients : Traffic::control;
}

void infer_allreduce_start(Program& p, OpDesc& op) {
  const auto& xs = op.ins("X");
  MIX_CHECK(!xs.empty(), op.type << " of an empty bucket");
  const DType dtype = p.var(xs[0]).dtype;
  int64_t total = 0;
  for (auto& x : xs) {
    const VarDesc& v = p.var(x);
    MIX_CHECK(v.dtype == dtype, op.type << ": bucket mixes dtypes: " << x << " is " << dtype_name(v.dtype) << ", "
                                         << xs[0] << " is " << dtype_name(dtype));
    MIX_CHECK(shape_numel(v.shape) >= 0, op.type << ": " << x << " has an unknown size " << shape_str(v.shape)
                                                 << " (gradients of parameters have fixed shapes)");
    total += shape_numel(v.shape);
  }
  declare_var(p, op.out("Buffer"), {total}, dtype);
}

void allreduce_start_cpu(OpContext& ctx) {
  MIX_CHECK(ctx.env.comm, "op " << ctx.op.type << " needs a communicator (ExecEnv::comm is null)");
  const auto& names = ctx.op.ins("X");
  MIX_CHECK(!names.empty(), ctx.op.type << " of an empty bucket");
  const std::string& buffer_name = ctx.op.out("Buffer");
  MIX_CHECK(!ctx.env.in_flight.count(buffer_name),
            ctx.op.type << ": " << buffer_name << " is already being reduced (started twice without a wait)");
  const DType dtype = ctx.scope.get(names[0]).dtype();
  int64_t total = 0;
  for (auto& n : names) {
    const Tensor& t = ctx.scope.get(n);
    MIX_CHECK(t.dtype() == dtype, "bucket mixes dtypes: " << n << " is " << dtype_name(t.dtype()) << ", " << names[0]
                                                          << " is " << dtype_name(dtype));
    total += t.numel();
  }
  Tensor* buffer = nullptr;
  if (names.size() == 1) {
    ctx.scope.set(buffer_name, ctx.scope.get(names[0]).reshaped({total}));  // a view: reduced in place
    buffer = &ctx.scope.get(buffer_name);
  } else {
    buffer = &ctx.out("Buffer", {total}, dtype);
    size_t offset = 0;
    for (auto& n : names) {
      const Tensor& t = ctx.scope.get(n);
      std::memcpy(static_cast<unsigned char*>(buffer->raw()) + offset, t.raw(), t.bytes());
      offset += t.bytes();
    }
  }
  scale_in_place(buffer->raw(), total, dtype, ctx.attr<float>("prescale", 1.f));
  ctx.env.in_flight[buffer_name] = ctx.env.comm->all_reduce_start(buffer->raw(), static_cast<size_t>(total), dtype,
                                                                   ReduceOp::sum, traffic_of(ctx));
}

void allreduce_wait_cpu(OpContext& ctx) {
  MIX_CHECK(ctx.env.comm, "op " << ctx.op.type << " needs a communicator (ExecEnv::comm is null)");
  const std::string& buffer_name = ctx.op.in("Buffer");
  auto it = ctx.env.in_flight.find(buffer_name);
  MIX_CHECK(it != ctx.env.in_flight.end(),
            ctx.op.type << ": no all-reduce of " << buffer_name << " is in flight (its c_allreduce_start did not run)");
  const Request request = it->second;
  ctx.env.in_flight.erase(it);
  ctx.env.comm->wait(request);
  const Tensor buffer = ctx.scope.get(buffer_name);
  scale_in_place(buffer.raw(), buffer.numel(), buffer.dtype(), ctx.attr<float>("postscale", 1.f));
  size_t offset = 0;
  for (size_t i = 0; i < ctx.op.outs("Out").size(); ++i) {
    Tensor& t = ctx.out_existing("Out", i);
    MIX_CHECK(t.dtype() == buffer.dtype() && offset + t.bytes() <= buffer.bytes(),
              ctx.op.type << ": " << ctx.op.outs("Out")[i] << " does not fit " << buffer_name);
    if (!t.shares_storage(buffer))
      std::memcpy(t.raw(), static_cast<const unsigned char*>(buffer.raw()) + offset, t.bytes());
    offset += t.bytes();
  }
  MIX_CHECK(offset == buffer.bytes(), ctx.op.type << ": Out holds " << offset << " bytes but " << buffer_name
                                                  << " holds " << buffer.bytes());
}

MIX_REGISTER_OP("c_allreduce_start", OpInfo{infer_allreduce_start, allreduce_start_cpu, {}, {}});
MIX_REGISTER_OP("c_allreduce_wait", OpInfo{{}, allreduce_wait_cpu, {}, {}});

MIX_REGISTER_OP("c_allreduce_sum", OpInfo{{}, [](OpContext& c) { allreduce_cpu(c, ReduceOp::sum); }, {}, {}});
MIX_REGISTER_OP("c_allreduce_max", OpInfo{{}, [](OpContext& c) { allreduce_cpu(c, ReduceOp::max); }, {}, {}});

}  // namespace
}  // namespace mix::collective
