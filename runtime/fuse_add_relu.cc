#include "runtime/fuse_add_relu.h"

#include <map>
#include <optional>
#include <utility>

#include "runtime/fuse_pairs.h"
#include "runtime/op_registry.h"

namespace mix {

FusedAddRelu fuse_add_relu(Program& p, const std::set<std::string>& keep) {
  FusedAddRelu n;
  n.forward = fuse_pairs(
      p, keep, "elementwise_add", "Out",
      [&p](const OpDesc& add, const OpDesc& relu, const std::string& slot) -> std::optional<OpDesc> {
        if (relu.type != "relu" || slot != "X") return std::nullopt;
        const VarDesc& x = p.var(add.in("X"));
        const VarDesc& y = p.var(add.in("Y"));
        // Broadcasting (a bias) is not what the fused kernel does.
        if (x.shape != y.shape || x.dtype != y.dtype) return std::nullopt;
        return make_op("fused_add_relu", {{"X", {add.in("X")}}, {"Y", {add.in("Y")}}}, {{"Out", {relu.out("Out")}}});
      });
  // The add's gradient reads Y for its shape and dtype alone
  // (runtime/ops/elementwise_add.cc), and the fused op checks, as it runs,
  // that its inputs have its Out's: reading Out there instead lets Y's
  // storage go when the forward is done with it (a downsampling block's
  // shortcut, kept until backward before) and leaves the fused op the only
  // reader of Y (runtime/fuse_bn_relu.h folds Y's batch norm into it).
  std::map<std::string, std::pair<std::string, size_t>> fused_out_of;  // input -> (fused op's Out, its index)
  for (size_t i = 0; i < p.ops().size(); ++i) {
    const OpDesc& op = p.ops()[i];
    if (op.type != "fused_add_relu") continue;
    for (const char* slot : {"X", "Y"}) fused_out_of[op.in(slot)] = {op.out("Out"), i};
  }
  for (size_t k = 0; k < p.ops().size(); ++k) {
    OpDesc& op = p.ops()[k];
    if (op.type != "elementwise_add_grad") continue;
    const auto it = fused_out_of.find(op.in("Y"));
    if (it == fused_out_of.end() || it->second.second > k) continue;
    op.inputs["Y"] = {it->second.first};
    ++n.grads_reading_out;
  }
  n.backward =
      fuse_pairs(p, keep, "sum", "Out",
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
