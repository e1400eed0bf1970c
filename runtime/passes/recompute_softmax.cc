#include "runtime/passes/recompute_softmax.h"

#include "runtime/ir/storage_writes.h"
#include "runtime/ops/cross_entropy_shapes.h"

namespace mix {

int recompute_softmax(Program& p, const std::set<std::string>& keep) {
  int rewritten = 0;
  for (size_t i = 0; i < p.ops().size(); ++i) {
    if (p.ops()[i].type != "softmax_with_cross_entropy") continue;
    const std::string softmax = p.ops()[i].out_or_empty("Softmax");
    if (softmax.empty() || keep.count(softmax) || p.var(softmax).persistable) continue;
    const auto reads = p.readers(softmax);
    if (reads.size() != 1 || reads.front().second != "Softmax") continue;
    OpDesc& grad = p.ops()[reads.front().first];
    if (grad.type != "softmax_with_cross_entropy_grad") continue;
    // The logits must still hold the forward's values when the grad runs:
    // nothing in between may write their storage, by their name or through a
    // view (a reshape2 of them, or what they are a view of).
    const std::string logits = p.ops()[i].in("Logits");
    if (storage_written_between(p, logits, i, reads.front().first)) continue;

    const std::string stats = p.unique_name(softmax + ".row_stats");
    declare_var(p, stats, xent::row_stats_shape(p.var(logits).shape), DType::f32);
    OpDesc& fwd = p.ops()[i];
    fwd.outputs.erase("Softmax");
    fwd.outputs["RowStats"] = {stats};
    grad.inputs.erase("Softmax");
    grad.inputs["Logits"] = {logits};
    grad.inputs["RowStats"] = {stats};
    grad.attrs["softmax_dtype"] = std::string(dtype_name(p.var(softmax).dtype));
    ++rewritten;
  }
  return rewritten;
}

}  // namespace mix
