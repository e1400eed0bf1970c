#include "runtime/passes/fuse_pairs.h"

#include <map>
#include <utility>
#include <vector>

namespace mix {

namespace {

// Whether `op` can move from `from` to `to` and still read the same values.
// Comparing names is not enough: a view (reshape2, an add's pass-through
// gradient) shares its storage with another variable, and an op may write
// a tensor in place. So only collective ops may lie between the two (the
// gradient-sync pass starts bucket all-reduces between backward ops; they
// pack and reduce parameter gradients, never activations or their views),
// and none of them may write one of `op`'s inputs by name either.
bool can_move(const Program& p, const OpDesc& op, size_t from, size_t to) {
  const std::vector<std::string> inputs = op.all_inputs();
  for (size_t k = from + 1; k < to; ++k) {
    const OpDesc& between = p.ops()[k];
    if (between.role != OpRole::collective) return false;
    for (const auto& out : between.all_outputs())
      for (const auto& in : inputs)
        if (out == in) return false;
  }
  return true;
}

}  // namespace

int fuse_pairs(Program& p, const std::set<std::string>& keep, const std::string& producer_type,
               const std::string& out_slot, const MakeFused& make_fused) {
  std::set<size_t> removed;
  std::map<size_t, OpDesc> replaced;  // consumer index -> fused op
  for (size_t i = 0; i < p.ops().size(); ++i) {
    const OpDesc& producer = p.ops()[i];
    if (producer.type != producer_type) continue;
    const std::string t = producer.out(out_slot);
    if (keep.count(t) || p.var(t).persistable || p.writer_count(t) != 1) continue;
    const auto reads = p.readers(t);
    if (reads.size() != 1 || reads.front().first <= i) continue;
    const auto& [j, slot] = reads.front();
    if (replaced.count(j) || p.ops()[j].ins(slot).size() != 1) continue;
    if (!can_move(p, producer, i, j)) continue;
    std::optional<OpDesc> fused = make_fused(producer, p.ops()[j], slot);
    if (!fused) continue;
    fused->role = p.ops()[j].role;
    removed.insert(i);
    replaced.emplace(j, std::move(*fused));
  }
  if (removed.empty()) return 0;
  std::vector<OpDesc> ops;
  ops.reserve(p.ops().size() - removed.size());
  for (size_t i = 0; i < p.ops().size(); ++i) {
    if (removed.count(i)) continue;
    auto it = replaced.find(i);
    ops.push_back(it == replaced.end() ? std::move(p.ops()[i]) : std::move(it->second));
  }
  p.ops() = std::move(ops);
  return static_cast<int>(removed.size());
}

}  // namespace mix
