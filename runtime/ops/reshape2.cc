// reshape2: Out = X viewed with a new shape (Tensor::reshaped: same storage, no
// copy). Attr shape follows Paddle: 0 copies X's dim at that index, one -1 is
// inferred from the element count, every other entry is the dim itself.
// Grad (reshape2_grad): X@GRAD = Out@GRAD viewed with X's runtime shape; it
// reads X only for that shape (the executor's memory plan counts neither
// output, since both are views).
#include <string>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"

namespace mix {
namespace {

std::vector<int64_t> shape_attr(const OpDesc& op) {
  MIX_CHECK(op.has_attr("shape"), "reshape2: attr 'shape' is required");
  return op.attr<std::vector<int64_t>>("shape", {});
}

// Applies the 0 (copy) entries and checks the attr; returns the index of the -1 entry, or -1.
int apply_copies(const std::vector<int64_t>& attr, const Shape& x, Shape& out) {
  int infer_at = -1;
  out.assign(attr.begin(), attr.end());
  for (size_t i = 0; i < attr.size(); ++i) {
    const int64_t a = attr[i];
    if (a == 0) {
      MIX_CHECK(i < x.size(), "reshape2: shape " << shape_str(attr) << " copies dim " << i << " (a 0 entry) but X "
                                                 << shape_str(x) << " has only " << x.size() << " dims");
      out[i] = x[i];
    } else if (a == -1) {
      MIX_CHECK(infer_at < 0, "reshape2: shape attr " << shape_str(attr) << " has more than one -1");
      infer_at = static_cast<int>(i);
    } else {
      MIX_CHECK(a > 0, "reshape2: invalid entry " << a << " in shape attr (use 0 to copy a dim, -1 to infer one)");
    }
  }
  return infer_at;
}

// The output shape for a concrete input shape.
Shape resolve_shape(const std::vector<int64_t>& attr, const Shape& x) {
  Shape out;
  const int infer_at = apply_copies(attr, x, out);
  const int64_t numel = shape_numel(x);
  if (infer_at >= 0) {
    int64_t rest = 1;
    for (size_t i = 0; i < out.size(); ++i)
      if (static_cast<int>(i) != infer_at) rest *= out[i];
    MIX_CHECK(rest > 0 && numel % rest == 0, "reshape2: cannot reshape X " << shape_str(x) << " (" << numel
                                                                           << " elements) to " << shape_str(attr));
    out[infer_at] = numel / rest;
  }
  MIX_CHECK(shape_numel(out) == numel, "reshape2: cannot reshape X " << shape_str(x) << " (" << numel
                                                                     << " elements) to " << shape_str(out) << " ("
                                                                     << shape_numel(out) << " elements)");
  return out;
}

// Build-time shapes may hold -1 (the batch). A 0 entry copies it; the -1 entry
// is then known only if every unknown dim of X was copied, so that the unknowns
// cancel out of numel(X) / (product of the other entries).
void infer_reshape2(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  const std::vector<int64_t> attr = shape_attr(op);
  Shape out;
  const int infer_at = apply_copies(attr, x.shape, out);
  int unknown_x = 0, unknown_copied = 0;
  int64_t known_x = 1, known_out = 1;
  for (int64_t d : x.shape) {
    if (d < 0)
      ++unknown_x;
    else
      known_x *= d;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (static_cast<int>(i) == infer_at) continue;
    if (out[i] < 0)
      ++unknown_copied;
    else
      known_out *= out[i];
  }
  const auto mismatch = [&] {
    return MIX_STR_CAT("reshape2: cannot reshape X " << x.name << " " << shape_str(x.shape) << " to "
                                                     << shape_str(attr));
  };
  if (unknown_x == unknown_copied) {
    if (infer_at >= 0) {
      MIX_CHECK(known_out > 0 && known_x % known_out == 0, mismatch());
      out[infer_at] = known_x / known_out;
    } else {
      MIX_CHECK(known_x == known_out, mismatch());
    }
  } else if (infer_at >= 0) {
    out[infer_at] = -1;  // absorbs the batch: known only at run time
  }
  declare_var(p, op.out("Out"), out, x.dtype);
}

void reshape2_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  ctx.scope.set(ctx.op.out("Out"), x.reshaped(resolve_shape(shape_attr(ctx.op), x.shape())));
}

void reshape2_grad_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Tensor& dout = ctx.in("Out@GRAD");
  MIX_CHECK(dout.numel() == x.numel(), "reshape2_grad: Out@GRAD " << shape_str(dout.shape()) << " does not hold X's "
                                                                  << x.numel() << " elements");
  ctx.scope.set(ctx.op.out("X@GRAD"), dout.reshaped(x.shape()));
}

std::vector<OpDesc> reshape2_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dx = g.grad_for_input(fwd.in("X"));
  if (dx.empty()) return {};
  return {make_op("reshape2_grad", {{"X", {fwd.in("X")}}, {"Out@GRAD", {g.grad_of_output(fwd.out("Out"))}}},
                  {{"X@GRAD", {dx}}})};
}

MIX_REGISTER_OP("reshape2", OpInfo{infer_reshape2, reshape2_cpu, {}, reshape2_grad_maker, views_of("X")});
MIX_REGISTER_OP("reshape2_grad", OpInfo{{}, reshape2_grad_cpu, {}, {}, views_of("Out@GRAD")});

}  // namespace
}  // namespace mix
