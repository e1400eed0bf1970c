#include "runtime/passes/fuse_add_relu.h"

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
