#include "amp/fold_casts.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/op_registry.h"
#include "runtime/ops/widening.h"

namespace mix::amp {

namespace {

/// The input slots whose op widens every value on load and can store FP32
/// outputs from a narrower input (the kernels honour out_dtype there).
bool widens_on_load(const std::string& op_type, const std::string& slot) {
  return (op_type == "softmax" && slot == "X") || (op_type == "softmax_with_cross_entropy" && slot == "Logits");
}

/// Whether `op` is a forward cast of an FP16/BF16 variable to FP32.
bool is_widening_cast(const Program& p, const OpDesc& op) {
  if (op.type != "cast" || op.role != OpRole::forward) return false;
  if (op.attr<std::string>("out_dtype", "") != dtype_name(DType::f32)) return false;
  const DType in = p.var(op.in("X")).dtype;
  return in == DType::f16 || in == DType::bf16;
}

/// Where variable `var` is read: (op index, slot) for every reading op after `from`.
std::vector<std::pair<size_t, std::string>> readers(const Program& p, const std::string& var, size_t from) {
  std::vector<std::pair<size_t, std::string>> found;
  for (size_t j = from + 1; j < p.ops().size(); ++j)
    for (const auto& [slot, names] : p.ops()[j].inputs)
      for (const auto& n : names)
        if (n == var) found.emplace_back(j, slot);
  return found;
}

}  // namespace

int fold_widening_casts(Program& p) {
  std::set<size_t> removed;
  std::vector<size_t> changed;
  for (size_t i = 0; i < p.ops().size(); ++i) {
    const OpDesc& cast = p.ops()[i];
    if (!is_widening_cast(p, cast)) continue;
    const std::string narrow = cast.in("X"), wide = cast.out("Out");
    if (p.var(wide).persistable) continue;
    // Exactly one reader: with two, the unfolded program adds their FP32
    // gradients and rounds the sum to FP16 once (the cast's gradient), while
    // folded readers would each round their own part before the sum.
    const auto reads = readers(p, wide, i);
    if (reads.size() != 1) continue;
    const auto& [j, slot] = reads.front();
    OpDesc& r = p.ops()[j];
    // A forward reader whose slot holds only this variable (so its outputs may
    // become FP32 while it reads FP16), not already storing another dtype.
    const bool foldable = r.role == OpRole::forward && widens_on_load(r.type, slot) && r.ins(slot).size() == 1 &&
                          (!r.has_attr("out_dtype") || r.attr<std::string>("out_dtype", "") == dtype_name(DType::f32));
    if (!foldable) continue;
    r.inputs[slot] = {narrow};
    r.attrs["out_dtype"] = std::string(dtype_name(DType::f32));
    changed.push_back(j);
    removed.insert(i);
  }
  if (removed.empty()) return 0;
  // Outputs keep their FP32 dtype (out_dtype), so only the readers are inferred again.
  for (size_t j : changed) infer_op(p, p.ops()[j]);
  std::vector<OpDesc> kept;
  kept.reserve(p.ops().size() - removed.size());
  for (size_t i = 0; i < p.ops().size(); ++i)
    if (!removed.count(i)) kept.push_back(std::move(p.ops()[i]));
  p.ops() = std::move(kept);
  return static_cast<int>(removed.size());
}

}  // namespace mix::amp
