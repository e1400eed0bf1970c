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

#include "collective/allreduce_bucket.h"
#include "collective/communicator.h"
#include "runtime/core/check.h"
#include "runtime/core/half.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"

namespace mix::collective {
namespace {

// dst = src * factor, rounded to the dtype as a GPU kernel would (fn::Scale, the
// CUDA twin's functor); a plain copy when factor is 1. src may be dst. Packing
// and scaling in one pass reads and writes the bucket once instead of twice,
// which is most of the CPU cost of a sync besides MPI's own copies.
void copy_scaled(const void* src, void* dst, int64_t n, DType dtype, float factor) {
  if (n == 0) return;  // an empty tensor may have no storage: memcpy must not see its null pointer
  if (factor == 1.f) {
    if (src != dst) std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(dtype));
    return;
  }
  if (dtype == DType::f16) {
    // The FP16 gradient buckets' case, fused (F16C); the same bits as the functor
    // below (tests/unit/test_half.cc checks it on every binary16 value).
    half_bulk::f16_scale(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), static_cast<size_t>(n),
                         factor);
    return;
  }
  cpu::dispatch_floating(dtype, [&](auto tag) {
    using T = decltype(tag);
    cpu::unary(static_cast<const T*>(src), static_cast<T*>(dst), n, fn::Scale{factor, 0.f, true});
  });
}

// Copies the tensors back to back into `buffer`, multiplied by `factor`.
void pack_scaled(const OpContext& ctx, const std::vector<std::string>& names, void* buffer, float factor) {
  auto* dst = static_cast<unsigned char*>(buffer);
  for (auto& n : names) {
    const Tensor& t = ctx.scope.get(n);
    copy_scaled(t.raw(), dst, t.numel(), t.dtype(), factor);
    dst += t.bytes();
  }
}

// The reverse: output i of Out gets its slice of `buffer` times `factor`; a
// one-tensor bucket's view is scaled where it lies.
void unpack_scaled(OpContext& ctx, const Tensor& buffer, const std::string& buffer_name, float factor) {
  for_each_slice(ctx, "Out", buffer, buffer_name, [&](Tensor& t, const std::string&, size_t offset, bool in_place) {
    const void* src = in_place ? t.raw() : static_cast<const unsigned char*>(buffer.raw()) + offset;
    copy_scaled(src, t.raw(), t.numel(), t.dtype(), factor);
  });
}

void allreduce_cpu(OpContext& ctx, ReduceOp op) {
  Communicator& comm = comm_of(ctx);
  const BucketShape b = bucket_shape(ctx, "X");
  const float prescale = ctx.attr<float>("prescale", 1.f), postscale = ctx.attr<float>("postscale", 1.f);
  MIX_CHECK(op == ReduceOp::sum || (prescale == 1.f && postscale == 1.f), "only sums take pre/post scaling");
  const auto n = static_cast<size_t>(b.elements);
  if (ctx.op.ins("X").size() == 1) {
    // One tensor: reduce it where it lies.
    Tensor& t = ctx.out_existing("Out", 0);
    copy_scaled(t.raw(), t.raw(), t.numel(), b.dtype, prescale);
    comm.all_reduce(t.raw(), n, b.dtype, op, traffic_of(ctx));
    copy_scaled(t.raw(), t.raw(), t.numel(), b.dtype, postscale);
    return;
  }
  const Tensor bucket = Tensor::empty({b.elements}, b.dtype);  // from the caching allocator: reused step after step
  pack_scaled(ctx, ctx.op.ins("X"), bucket.raw(), prescale);
  comm.all_reduce(bucket.raw(), n, b.dtype, op, traffic_of(ctx));
  unpack_scaled(ctx, bucket, "the packed bucket", postscale);
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
  const StartBuffer b = start_buffer(ctx);
  const float prescale = ctx.attr<float>("prescale", 1.f);
  if (b.packed) {
    pack_scaled(ctx, ctx.op.ins("X"), b.tensor->raw(), prescale);
  } else {
    copy_scaled(b.tensor->raw(), b.tensor->raw(), b.shape.elements, b.shape.dtype, prescale);
  }
  start_sum(ctx, b);
}

void allreduce_wait_cpu(OpContext& ctx) {
  const Request request = take_started(ctx);
  ctx.env.comm->wait(request);
  const std::string& buffer_name = ctx.op.in("Buffer");
  const Tensor buffer = ctx.scope.get(buffer_name);  // a handle, not a reference into the scope the outputs change
  unpack_scaled(ctx, buffer, buffer_name, ctx.attr<float>("postscale", 1.f));
}

// A one-gradient bucket is reduced where it lies: its Buffer is a view.
MIX_REGISTER_OP("c_allreduce_start",
                OpInfo{infer_allreduce_start, allreduce_start_cpu, {}, {}, [](const OpDesc& op, const std::string&) {
                         return op.ins("X").size() == 1 ? op.ins("X")[0] : std::string();
                       }});
MIX_REGISTER_OP("c_allreduce_wait", OpInfo{{}, allreduce_wait_cpu, {}, {}});

// Blocking: on a GPU the communicator's all_reduce waits on the host for its
// collective (the overlapped c_allreduce_start/wait pair does not).
OpInfo blocking_allreduce(ReduceOp op) {
  OpInfo info{{}, [op](OpContext& c) { allreduce_cpu(c, op); }, {}, {}};
  info.host_waits = true;
  return info;
}

MIX_REGISTER_OP("c_allreduce_sum", blocking_allreduce(ReduceOp::sum));
MIX_REGISTER_OP("c_allreduce_max", blocking_allreduce(ReduceOp::max));

}  // namespace
}  // namespace mix::collective
