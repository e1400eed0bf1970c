#pragma once
// elementwise_add_grad's pass-through gradients as views. dX is dOut, and so
// is dY when Y has Out's shape (a residual add): instead of copying dOut,
// such a gradient can share its storage, which saves a read and a write of
// every activation gradient a residual add passes back (ResNet-50 at batch 64:
// about 2.8 GB of memory traffic per step) and their memory.
//
// Sharing is safe only for a gradient nobody writes in place later. Gradient
// sync packs, all-reduces (a one-gradient bucket where it lies, while backward
// goes on) and unscales in place the gradients of the parameters and of their
// FP16 casts, so those keep storage of their own. The grad maker decides, per
// input, and records it in attrs x_grad_is_view / y_grad_is_view; the kernels
// (CPU and CUDA alike: a view touches no data) and the executor's memory plan
// read the attrs.
#include <cstdint>
#include <string>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/elementwise_add_shapes.h"

namespace mix {

/// True when `var`'s gradient may be written in place after backward: `var`
/// is a parameter, or a cast or reshape of one (whose gradient is the
/// parameter's, or a view of it).
inline bool gradient_written_in_place(const Program& p, std::string var) {
  size_t before = SIZE_MAX;  // each step looks at earlier ops only, so the walk ends
  for (;;) {
    if (!p.has_var(var)) return false;
    if (p.var(var).persistable) return true;
    const std::optional<size_t> k = p.producer(var, before);
    if (!k) return false;
    const OpDesc& op = p.ops()[*k];
    if (op.type != "cast" && op.type != "reshape2" && op.type != "flatten") return false;
    var = op.in("X");
    before = *k;
  }
}

/// ViewFn of elementwise_add_grad: Out@GRAD for the outputs that share its storage.
inline std::string add_grad_viewed_input(const OpDesc& op, const std::string& out) {
  const bool view = (out == op.out_or_empty("X@GRAD") && op.attr<bool>("x_grad_is_view", false)) ||
                    (out == op.out_or_empty("Y@GRAD") && op.attr<bool>("y_grad_is_view", false));
  return view ? op.in("Out@GRAD") : std::string();
}

/// Binds the wanted gradients the attrs make views of dOut; returns, per
/// input, whether the kernel still has to compute that gradient. (dY's attr
/// comes from the declared shapes; a Y that turns out smaller at run time,
/// broadcast after all, gets its sum computed.)
struct AddGradLeft {
  bool x = false, y = false;
};
inline AddGradLeft bind_add_grad_views(OpContext& ctx, const Tensor& dout, const add_rules::AddGradY& y) {
  AddGradLeft left;
  if (ctx.wants("X@GRAD")) {
    left.x = !ctx.attr<bool>("x_grad_is_view", false);
    if (!left.x) ctx.scope.set(ctx.op.out("X@GRAD"), dout);
  }
  if (ctx.wants("Y@GRAD")) {
    left.y = !(ctx.attr<bool>("y_grad_is_view", false) && y.shape == dout.shape() && y.dtype == dout.dtype());
    if (!left.y) ctx.scope.set(ctx.op.out("Y@GRAD"), dout);
  }
  return left;
}

}  // namespace mix
