#include "runtime/passes/fuse_add_layer_norm.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/ir/op_registry.h"
#include "runtime/ir/storage_writes.h"
#include "runtime/ops/fused_add_layer_norm_shapes.h"

namespace mix {

namespace {

// Whether the add at `i` is one fused_add_layer_norm takes: Y of X's shape
// (X's dtype, or FP16/BF16 beside FP32) or of X's trailing dims (X's dtype),
// added over X's last dims (axis -1).
bool residual_add(const Program& p, const OpDesc& add) {
  if (add.type != "elementwise_add" || add.role != OpRole::forward) return false;
  if (add.attr<int>("axis", -1) != -1) return false;
  const VarDesc& x = p.var(add.in("X"));
  const VarDesc& y = p.var(add.in("Y"));
  if (!add_layer_norm_rules::y_is_trailing(x.shape, y.shape)) return false;
  const bool narrow_y = x.dtype == DType::f32 && (y.dtype == DType::f16 || y.dtype == DType::bf16);
  return y.dtype == x.dtype || (narrow_y && x.shape == y.shape);
}

// The first op after `i` that normalises `var`: a forward layer_norm reading
// it as X, with Mean and Variance outputs. (Other readers may come first: the
// fused op writes `var` where the add did.)
std::optional<size_t> layer_norm_of(const Program& p, const std::string& var, size_t i) {
  for (const auto& [j, slot] : p.readers(var)) {
    const OpDesc& ln = p.ops()[j];
    if (j <= i || ln.type != "layer_norm" || ln.role != OpRole::forward || slot != "X") continue;
    if (ln.out_or_empty("Mean").empty() || ln.out_or_empty("Variance").empty()) return std::nullopt;
    return j;
  }
  return std::nullopt;
}

// Whether the layer norm at `j` can run at `i` instead: no op between touches
// its outputs by name or writes its Scale or Bias.
bool can_run_earlier(const Program& p, const OpDesc& ln, size_t i, size_t j) {
  for (const std::string& out : ln.all_outputs())
    if (named_between(p, out, i, j)) return false;
  for (const char* slot : {"Scale", "Bias"}) {
    const std::string param = ln.in_or_empty(slot);
    if (!param.empty() && storage_written_between(p, param, i, j)) return false;
  }
  return true;
}

OpDesc fused(const OpDesc& add, const OpDesc& ln) {
  std::map<std::string, std::vector<std::string>> ins{{"X", {add.in("X")}}, {"Y", {add.in("Y")}}};
  for (const char* slot : {"Scale", "Bias"})
    if (!ln.in_or_empty(slot).empty()) ins[slot] = {ln.in(slot)};
  OpDesc op = make_op("fused_add_layer_norm", ins,
                      {{"Out", {add.out("Out")}},
                       {"Norm", {ln.out("Y")}},
                       {"Mean", {ln.out("Mean")}},
                       {"Variance", {ln.out("Variance")}}},
                      ln.attrs);
  op.role = OpRole::forward;
  return op;
}

}  // namespace

int fuse_add_layer_norm(Program& p) {
  int fused_pairs = 0;
  for (size_t i = 0; i < p.ops().size(); ++i) {
    const OpDesc& add = p.ops()[i];
    if (!residual_add(p, add)) continue;
    const std::optional<size_t> j = layer_norm_of(p, add.out("Out"), i);
    if (!j || !can_run_earlier(p, p.ops()[*j], i, *j)) continue;
    OpDesc op = fused(add, p.ops()[*j]);
    p.ops().erase(p.ops().begin() + static_cast<std::ptrdiff_t>(*j));
    p.ops()[i] = std::move(op);
    ++fused_pairs;
  }
  return fused_pairs;
}

}  // namespace mix
