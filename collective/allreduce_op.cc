// c_allreduce_sum / c_allreduce_max: in-place all-reduce of a bucket of
// tensors of one dtype through the program's communicator. The bucket is
// packed into one contiguous buffer so that it costs one collective call.
// Sum buckets take Horovod/Apex-style scaling: multiply by `prescale` before
// the sum (on pack) and by `postscale` after it (on unpack), rounding to the
// bucket's dtype each time as a GPU kernel would.
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

MIX_REGISTER_OP("c_allreduce_sum", OpInfo{{}, [](OpContext& c) { allreduce_cpu(c, ReduceOp::sum); }, {}, {}});
MIX_REGISTER_OP("c_allreduce_max", OpInfo{{}, [](OpContext& c) { allreduce_cpu(c, ReduceOp::max); }, {}, {}});

}  // namespace
}  // namespace mix::collective
