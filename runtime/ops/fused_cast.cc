// fused_cast: Out[i] = cast(X[i]) for a list of tensors of one floating dtype
// to another (attr out_dtype), in one op. amp::fuse_param_casts
// (amp/fuse_param_casts.h) puts it where amp::rewrite's casts of the FP32
// master weights to FP16 were, one cast op per weight: the same bits (each
// element widened exactly and rounded once, as cast's), one multi-tensor
// launch on a GPU instead of one per weight. It exists only after autodiff,
// so it has no gradient of its own.
#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/gemm.h"

namespace mix {
namespace {

DType out_dtype(const OpDesc& op) { return parse_dtype(op.attr<std::string>("out_dtype", "f32")); }

void infer_fused_cast(Program& p, OpDesc& op) {
  const auto& xs = op.ins("X");
  const auto& outs = op.outs("Out");
  MIX_CHECK(xs.size() == outs.size(),
            "fused_cast: " << xs.size() << " inputs X but " << outs.size() << " outputs Out (one per input)");
  const DType to = out_dtype(op);
  for (size_t i = 0; i < xs.size(); ++i) {
    const VarDesc& x = p.var(xs[i]);
    MIX_CHECK(is_floating(x.dtype) && is_floating(to), "fused_cast: casts floating dtypes only, X "
                                                           << xs[i] << " is " << dtype_name(x.dtype)
                                                           << " and out_dtype " << dtype_name(to));
    declare_var(p, outs[i], x.shape, to);
  }
}

void fused_cast_cpu(OpContext& ctx) {
  const DType to = out_dtype(ctx.op);
  const std::vector<const Tensor*> xs = ctx.ins("X");
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = *xs[i];
    MIX_CHECK(is_floating(x.dtype()), "fused_cast: X " << ctx.op.ins("X")[i] << " is " << dtype_name(x.dtype()));
    Tensor& out = ctx.out("Out", x.shape(), to, i);
    cpu::store_f32(cpu::as_f32(x, 3), out);  // as cast's: widen exactly, round once on store
  }
}

MIX_REGISTER_OP("fused_cast", OpInfo{infer_fused_cast, fused_cast_cpu, {}, {}});

}  // namespace
}  // namespace mix
