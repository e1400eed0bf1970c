#include "runtime/passes/fuse_bn_relu.h"

#include <map>
#include <optional>

#include "runtime/passes/fuse_pairs.h"

namespace mix {

FusedBnRelu fuse_bn_relu(Program& p, const std::set<std::string>& keep) {
  FusedBnRelu n;
  // The fused forwards by their output y (the relu's output).
  std::map<std::string, OpDesc> fused_forward;
  n.forward =
      fuse_pairs(p, keep, "batch_norm", "Y",
                 [&](const OpDesc& bn, const OpDesc& consumer, const std::string& slot) -> std::optional<OpDesc> {
                   if (bn.attr<bool>("fuse_with_relu", false)) return std::nullopt;
                   OpDesc fused = bn;
                   fused.attrs["fuse_with_relu"] = true;
                   fused.outputs["Y"] = {consumer.out("Out")};
                   if (consumer.type == "relu" && slot == "X") {
                     fused_forward.emplace(consumer.out("Out"), fused);
                     return fused;
                   }
                   // A residual block's end: relu(batch_norm(x) + shortcut) as fuse_add_relu left it.
                   if (consumer.type == "fused_add_relu" && (slot == "X" || slot == "Y")) {
                     const std::string z = consumer.in(slot == "X" ? "Y" : "X");
                     if (p.var(z).dtype != p.var(bn.in("X")).dtype || p.var(z).shape != p.var(bn.in("X")).shape)
                       return std::nullopt;
                     fused.inputs["Z"] = {z};
                     ++n.forward_add;
                     return fused;
                   }
                   return std::nullopt;
                 });
  n.forward -= n.forward_add;
  n.backward = fuse_pairs(
      p, keep, "relu_grad", "X@GRAD",
      [&](const OpDesc& relu_grad, const OpDesc& bn_grad, const std::string& slot) -> std::optional<OpDesc> {
        if (bn_grad.type != "batch_norm_grad" || slot != "Y@GRAD" || bn_grad.attr<bool>("fuse_with_relu", false))
          return std::nullopt;
        // The mask is recomputed from the forward's x and statistics: this
        // relu_grad must be the gradient of the relu fused into that forward.
        const auto fwd = fused_forward.find(relu_grad.in("Out"));
        if (fwd == fused_forward.end()) return std::nullopt;
        const OpDesc& bn = fwd->second;
        if (bn.in("X") != bn_grad.in("X") || bn.out("SavedMean") != bn_grad.in("SavedMean") ||
            bn.out("SavedVariance") != bn_grad.in("SavedVariance") || bn.in("Scale") != bn_grad.in("Scale"))
          return std::nullopt;
        if (p.var(relu_grad.in("Out@GRAD")).dtype != p.var(bn.in("X")).dtype) return std::nullopt;
        OpDesc fused = bn_grad;
        fused.inputs["Y@GRAD"] = {relu_grad.in("Out@GRAD")};
        fused.inputs["Y"] = {relu_grad.in("Out")};
        fused.inputs["Bias"] = {bn.in("Bias")};
        fused.attrs["fuse_with_relu"] = true;
        return fused;
      });
  return n;
}

}  // namespace mix
