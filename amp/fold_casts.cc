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

// Removes the ops at `removed` (indices); returns how many.
int erase_ops(Program& p, const std::set<size_t>& removed) {
  if (removed.empty()) return 0;
  std::vector<OpDesc> kept;
  kept.reserve(p.ops().size() - removed.size());
  for (size_t i = 0; i < p.ops().size(); ++i)
    if (!removed.count(i)) kept.push_back(std::move(p.ops()[i]));
  p.ops() = std::move(kept);
  return static_cast<int>(removed.size());
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
  return erase_ops(p, removed);
}

}  // namespace

int fold_widening_casts(Program& p) {
  // The input slots whose op widens every value on load and can store FP32
  // outputs from a narrower input (the kernels honour out_dtype there).
  const auto row_op_accepts = [](const OpDesc& r, const std::string& slot) {
    const bool widens =
        (r.type == "softmax" && slot == "X") || (r.type == "softmax_with_cross_entropy" && slot == "Logits");
    return widens && (!r.has_attr("out_dtype") || r.attr<std::string>("out_dtype", "") == kF32);
  };
  // elementwise_add takes a narrower Y beside an FP32 X of the same shape (a
  // residual add); a cast feeding X trades places with Y, as addition commutes.
  const auto other_slot = [](const std::string& slot) { return slot == "X" ? std::string("Y") : std::string("X"); };
  const auto add_accepts = [&](const OpDesc& r, const std::string& slot) {
    if (r.type != "elementwise_add" || (slot != "X" && slot != "Y") || r.ins(other_slot(slot)).size() != 1)
      return false;
    const VarDesc& wide = p.var(r.in(slot));
    const VarDesc& other = p.var(r.in(other_slot(slot)));
    return other.dtype == DType::f32 && other.shape == wide.shape;
  };
  const auto accepts = [&](const OpDesc& r, const std::string& slot) {
    return r.role == OpRole::forward && (row_op_accepts(r, slot) || add_accepts(r, slot));
  };
  const auto rewire = [&](OpDesc& r, const std::string& slot, const std::string& narrow) {
    if (r.type == "elementwise_add") {
      r.inputs["X"] = {r.in(other_slot(slot))};
      r.inputs["Y"] = {narrow};
    } else {
      r.inputs[slot] = {narrow};
      r.attrs["out_dtype"] = kF32;
    }
    infer_op(p, r);  // its outputs stay FP32: nothing after it changes
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

int fold_casts_into_producers(Program& p) {
  // The ops that compute in FP32 and round once on store to attr out_dtype
  // (their CPU and CUDA kernels alike), and the output slot it applies to:
  // image_normalize's Out, any floating dtype; layer_norm's Y, any floating
  // dtype from the FP32 X that the cast's FP32 input implies (its statistics
  // stay FP32; layer_norm_rules::y_dtype).
  const auto rounded_slot = [](const OpDesc& op) -> std::string {
    if (op.type == "image_normalize") return "Out";
    if (op.type == "layer_norm") return "Y";
    return {};
  };
  std::set<size_t> removed;
  for (size_t i = 0; i < p.ops().size(); ++i) {
    const OpDesc& cast = p.ops()[i];
    if (cast.type != "cast" || cast.role != OpRole::forward) continue;
    const std::string wide = cast.in("X"), narrow = cast.out("Out");
    // From FP32 only: one rounding of the FP32 value, as the cast's. (A cast of
    // an FP16 value to BF16 would round twice, which a direct store does not.)
    if (p.var(wide).dtype != DType::f32 || p.var(wide).persistable || !is_floating(p.var(narrow).dtype)) continue;
    // The cast is the one reader of the FP32 value, each variable has one
    // writer, so moving the narrow value's write up to the producer changes
    // nothing any other op sees.
    if (p.readers(wide).size() != 1 || p.writer_count(wide) != 1 || p.writer_count(narrow) != 1) continue;
    const std::optional<size_t> j = p.producer(wide, i);
    if (!j) continue;  // a feed
    OpDesc& producer = p.ops()[*j];
    const std::string slot = rounded_slot(producer);
    if (slot.empty() || producer.role != OpRole::forward || producer.outs(slot).size() != 1 ||
        producer.out(slot) != wide)
      continue;
    producer.outputs[slot] = {narrow};
    producer.attrs["out_dtype"] = std::string(dtype_name(p.var(narrow).dtype));
    infer_op(p, producer);  // declares `narrow` as it was: the cast's shape and dtype
    removed.insert(i);
  }
  return erase_ops(p, removed);
}

}  // namespace mix::amp
