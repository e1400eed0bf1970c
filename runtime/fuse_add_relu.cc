#include "runtime/fuse_add_relu.h"

#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "runtime/op_registry.h"

namespace mix {

namespace {

/// Whether `op` can move from `from` to `to` and still read the same values.
/// Comparing names is not enough: a view (reshape2, an add's pass-through
/// gradient) shares its storage with another variable, and an op may write
/// a tensor in place. So only collective ops may lie between the two (the
/// gradient-sync pass starts bucket all-reduces between backward ops; they
/// pack and reduce parameter gradients, never activations or their views),
/// and none of them may write one of `op`'s inputs by name either.
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

/// A producer whose output "Out" has one reader, the consumer, which the fused
/// op replaces (at the consumer's place, where the producer's inputs still
/// hold their values). `fuse(producer, consumer, slot)` returns the fused op,
/// or nothing where this pair does not fit.
using MakeFused =
    std::function<std::optional<OpDesc>(const OpDesc& producer, const OpDesc& consumer, const std::string& slot)>;

int fuse_pairs(Program& p, const std::set<std::string>& keep, const std::string& producer_type,
               const MakeFused& make_fused) {
  std::set<size_t> removed;
  std::map<size_t, OpDesc> replaced;  // consumer index -> fused op
  for (size_t i = 0; i < p.ops().size(); ++i) {
    const OpDesc& producer = p.ops()[i];
    if (producer.type != producer_type) continue;
    const std::string t = producer.out("Out");
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

}  // namespace

FusedAddRelu fuse_add_relu(Program& p, const std::set<std::string>& keep) {
  FusedAddRelu n;
  n.forward = fuse_pairs(
      p, keep, "elementwise_add",
      [&p](const OpDesc& add, const OpDesc& relu, const std::string& slot) -> std::optional<OpDesc> {
        if (relu.type != "relu" || slot != "X") return std::nullopt;
        const VarDesc& x = p.var(add.in("X"));
        const VarDesc& y = p.var(add.in("Y"));
        // Broadcasting (a bias) is not what the fused kernel does.
        if (x.shape != y.shape || x.dtype != y.dtype) return std::nullopt;
        return make_op("fused_add_relu", {{"X", {add.in("X")}}, {"Y", {add.in("Y")}}}, {{"Out", {relu.out("Out")}}});
      });
  n.backward =
      fuse_pairs(p, keep, "sum",
                 [&p](const OpDesc& sum, const OpDesc& relu_grad, const std::string& slot) -> std::optional<OpDesc> {
                   if (relu_grad.type != "relu_grad" || slot != "Out@GRAD") return std::nullopt;
                   const DType g = p.var(sum.out("Out")).dtype;
                   for (const auto& part : sum.ins("X"))
                     if (p.var(part).dtype != g) return std::nullopt;
                   if (p.var(relu_grad.in("Out")).dtype != g) return std::nullopt;
                   return make_op("fused_sum_relu_grad", {{"Out", {relu_grad.in("Out")}}, {"Out@GRAD", sum.ins("X")}},
                                  {{"X@GRAD", {relu_grad.out("X@GRAD")}}});
                 });
  return n;
}

}  // namespace mix
