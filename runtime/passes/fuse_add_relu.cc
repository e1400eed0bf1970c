#include "runtime/passes/fuse_add_relu.h"

#include <map>
#include <optional>

#include "runtime/ir/op_registry.h"
#include "runtime/passes/fuse_pairs.h"

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
  // reader of Y (runtime/passes/fuse_bn_relu.h folds Y's batch norm into it).
  // The gradient of the add fused into op f is found through relu's: its
  // Out@GRAD is written by the relu_grad that reads f's Out.
  std::map<std::string, size_t> fused_by_out;  // fused op's Out -> its index
  for (size_t i = 0; i < p.ops().size(); ++i)
    if (p.ops()[i].type == "fused_add_relu") fused_by_out[p.ops()[i].out("Out")] = i;
  for (size_t k = 0; k < p.ops().size(); ++k) {
    if (p.ops()[k].type != "elementwise_add_grad") continue;
    const std::optional<size_t> relu_grad = p.producer(p.ops()[k].in("Out@GRAD"), k);
    if (!relu_grad || p.ops()[*relu_grad].type != "relu_grad") continue;
    const auto fused = fused_by_out.find(p.ops()[*relu_grad].in("Out"));
    if (fused == fused_by_out.end() || fused->second > k) continue;
    const OpDesc& f = p.ops()[fused->second];
    OpDesc& grad = p.ops()[k];
    if (grad.in("Y") != f.in("X") && grad.in("Y") != f.in("Y")) continue;
    grad.inputs["Y"] = {f.out("Out")};
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
