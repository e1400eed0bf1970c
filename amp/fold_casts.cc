#include "amp/fold_casts.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/ir/op_registry.h"
#include "runtime/ir/storage_writes.h"
#include "runtime/ops/widening.h"

namespace mix::amp {

namespace {

const std::string kF32(dtype_name(DType::f32));

// Whether `op` is a cast of `role` from an FP16/BF16 variable to FP32.
bool is_widening_cast(const Program& p, const OpDesc& op, OpRole role) {
  if (op.type != "cast" || op.role != role) return false;
  if (op.attr<std::string>("out_dtype", "") != kF32) return false;
  const DType in = p.var(op.in("X")).dtype;
  return in == DType::f16 || in == DType::bf16;
}

// Removes each widening cast of `role` whose one reader `accepts(reader,
// slot)`, after `rewire(reader, slot, narrow)` has made that reader read the
// cast's FP16/BF16 input instead. Returns how many casts it removed.
//
// Exactly one reader. Forward: with two, the unfolded program adds their
// FP32 gradients and rounds the sum to FP16 once (the cast's gradient),
// while folded readers would each round their own part before the sum.
// Backward: any other reader still needs the FP32 value.
template <typename Accepts, typename Rewire>
int fold(Program& p, OpRole role, Accepts accepts, Rewire rewire) {
  std::set<size_t> removed;
  for (size_t i = 0; i < p.ops().size(); ++i) {
    const OpDesc& cast = p.ops()[i];
    if (!is_widening_cast(p, cast, role)) continue;
    const std::string narrow = cast.in("X"), wide = cast.out("Out");
    if (p.var(wide).persistable) continue;
    const auto reads = p.readers(wide);  // all after i: the cast writes `wide`
    if (reads.size() != 1) continue;
    const auto& [j, slot] = reads.front();
    OpDesc& reader = p.ops()[j];
    // The slot must hold only this variable, so that its dtype is the slot's.
    if (reader.ins(slot).size() != 1 || !accepts(reader, slot)) continue;
    // The reader now reads `narrow` at j, not at i: it must hold the same values then.
    if (storage_written_between(p, narrow, i, j)) continue;
    rewire(reader, slot, narrow);
    removed.insert(i);
  }
  if (removed.empty()) return 0;
  std::vector<OpDesc> kept;
  kept.reserve(p.ops().size() - removed.size());
  for (size_t i = 0; i < p.ops().size(); ++i)
    if (!removed.count(i)) kept.push_back(std::move(p.ops()[i]));
  p.ops() = std::move(kept);
  return static_cast<int>(removed.size());
}

}  // namespace

int fold_widening_casts(Program& p) {
  // The input slots whose op widens every value on load and can store FP32
  // outputs from a narrower input (the kernels honour out_dtype there).
  const auto accepts = [](const OpDesc& r, const std::string& slot) {
    const bool widens =
        (r.type == "softmax" && slot == "X") || (r.type == "softmax_with_cross_entropy" && slot == "Logits");
    return widens && r.role == OpRole::forward &&
           (!r.has_attr("out_dtype") || r.attr<std::string>("out_dtype", "") == kF32);
  };
  const auto rewire = [&p](OpDesc& r, const std::string& slot, const std::string& narrow) {
    r.inputs[slot] = {narrow};
    r.attrs["out_dtype"] = kF32;
    infer_op(p, r);  // its outputs stay FP32 (out_dtype): nothing after it changes
  };
  return fold(p, OpRole::forward, accepts, rewire);
}

int fold_widening_grad_casts(Program& p) {
  // softmax_grad widens Out@GRAD on load; its Out (and so the gradient the
  // cast made) is FP32.
  const auto accepts = [&p](const OpDesc& r, const std::string& slot) {
    return r.type == "softmax_grad" && slot == "Out@GRAD" && p.var(r.in("Out")).dtype == DType::f32;
  };
  const auto rewire = [](OpDesc& r, const std::string& slot, const std::string& narrow) { r.inputs[slot] = {narrow}; };
  return fold(p, OpRole::backward, accepts, rewire);
}

}  // namespace mix::amp
