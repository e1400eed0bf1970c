// split: X cut along one axis into consecutive parts (Paddle's split; a
// Transformer cuts its fused qkv [B, T, 3D] with axis -1, num 3).
//   input   X, any dtype (elements are copied as bytes)
//   attrs   axis (int64, default 0; negative counts from the end) and exactly
//           one of num (int64 > 0: equal parts, which must divide the dim) or
//           sections (vector<int64_t>: the part sizes, at most one -1 = the rest)
//   output  Out: a LIST of variables, one per part, in order (OpDesc outputs
//           {"Out", {"q", "k", "v"}}); its length must equal num / sections
// The parts are contiguous copies: per leading index, one memcpy of
// size * inner elements per part (a CUDA twin is one cudaMemcpy2DAsync per part).
//
// Grad (split_grad, i.e. concat along the same axis): input Out@GRAD, the list
// of part gradients in Out's order, where an entry is "" when no gradient
// flows into that part (an unused output): that part of X@GRAD is zeros. Then
// X is an input too, read for its shape only (to size the missing parts);
// when every part has a gradient, X is not kept alive for the backward.
// Output X@GRAD in the parts' dtype.
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/split_shapes.h"

namespace mix {
namespace {

using split_rules::check_out_count;
using split_rules::part_sizes;
using split_rules::split_axis;
using split_rules::Strips;
using split_rules::strips_of;
using split_rules::with_dim;

void infer_split(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  const size_t axis = split_axis(op, x.shape);
  const std::vector<int64_t> sizes = part_sizes(op, x.shape, axis);
  const auto& outs = op.outs("Out");
  check_out_count(op, outs.size(), sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) declare_var(p, outs[k], with_dim(x.shape, axis, sizes[k]), x.dtype);
}

void split_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const size_t axis = split_axis(ctx.op, x.shape());
  const std::vector<int64_t> sizes = part_sizes(ctx.op, x.shape(), axis);
  check_out_count(ctx.op, ctx.op.outs("Out").size(), sizes.size());
  const Strips s = strips_of(x.shape(), axis, x.dtype());
  const auto* src = static_cast<const unsigned char*>(x.raw());
  int64_t start = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    Tensor& out = ctx.out("Out", with_dim(x.shape(), axis, sizes[k]), x.dtype(), k);
    auto* dst = static_cast<unsigned char*>(out.raw());
    const size_t part = static_cast<size_t>(sizes[k]) * s.inner_bytes;
    if (part > 0)
      for (int64_t o = 0; o < s.outer; ++o)
        std::memcpy(dst + static_cast<size_t>(o) * part, src + (static_cast<size_t>(o * s.dim + start)) * s.inner_bytes,
                    part);
    start += sizes[k];
  }
}

void split_grad_cpu(OpContext& ctx) {
  const std::vector<const Tensor*> parts = split_rules::grad_inputs(ctx.op, ctx.scope);
  const split_rules::GradParts g = split_rules::grad_parts(ctx.op, parts, ctx.in_opt("X"));
  const std::vector<int64_t>& sizes = g.sizes;
  const Shape& xs = g.x_shape;
  Tensor& dx = ctx.out("X@GRAD", xs, g.dtype);
  const Strips s = strips_of(xs, g.axis, g.dtype);
  auto* dst = static_cast<unsigned char*>(dx.raw());
  int64_t start = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const size_t part = static_cast<size_t>(sizes[k]) * s.inner_bytes;
    const auto* src = parts[k] ? static_cast<const unsigned char*>(parts[k]->raw()) : nullptr;
    if (part > 0)
      for (int64_t o = 0; o < s.outer; ++o) {
        unsigned char* d = dst + static_cast<size_t>(o * s.dim + start) * s.inner_bytes;
        if (src)
          std::memcpy(d, src + static_cast<size_t>(o) * part, part);
        else
          std::memset(d, 0, part);  // all-zero bytes are 0 in every dtype
      }
    start += sizes[k];
  }
}

std::vector<OpDesc> split_grad_maker(const OpDesc& fwd, GradContext& g) {
  std::vector<std::string> douts;
  bool any = false, missing = false;
  for (auto& o : fwd.outs("Out")) {
    douts.push_back(g.grad_of_output(o));
    any = any || !douts.back().empty();
    missing = missing || douts.back().empty();
  }
  if (!any) return {};
  const std::string dx = g.grad_for_input(fwd.in("X"));
  if (dx.empty()) return {};
  std::map<std::string, std::vector<std::string>> ins{{"Out@GRAD", douts}};
  if (missing) ins["X"] = {fwd.in("X")};
  return {make_op("split_grad", ins, {{"X@GRAD", {dx}}}, fwd.attrs)};
}

MIX_REGISTER_OP("split", OpInfo{infer_split, split_cpu, {}, split_grad_maker});
MIX_REGISTER_OP("split_grad", OpInfo{{}, split_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
