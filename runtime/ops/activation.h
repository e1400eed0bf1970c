#pragma once
// Registration of an elementwise activation from its forward and backward
// functors (runtime/kernels/functors.h). The backward functor reads either the
// forward output (relu, tanh) or the forward input (gelu).
#include <string>

#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"

namespace mix {

enum class GradReads { input, output };

template <typename Fwd, typename Bwd>
bool register_activation(const std::string& type, GradReads reads) {
  const std::string grad_type = type + "_grad";
  const char* saved_slot = reads == GradReads::input ? "X" : "Out";
  OpInfo fwd;
  fwd.infer = same_as_input();
  fwd.cpu = [](OpContext& ctx) {
    const Tensor& x = ctx.in("X");
    Tensor& out = ctx.out("Out", x.shape(), x.dtype());
    cpu::unary_tensor(x, out, Fwd{});
  };
  fwd.grad = [grad_type, saved_slot](const OpDesc& op, GradContext& g) -> std::vector<OpDesc> {
    const std::string dx = g.grad_for_input(op.in("X"));
    if (dx.empty()) return {};
    const std::string saved = std::string(saved_slot) == "X" ? op.in("X") : op.out("Out");
    return {make_op(grad_type, {{saved_slot, {saved}}, {"Out@GRAD", {g.grad_of_output(op.out("Out"))}}},
                    {{"X@GRAD", {dx}}})};
  };
  OpInfo bwd;
  bwd.cpu = [saved_slot](OpContext& ctx) {
    const Tensor& saved = ctx.in(saved_slot);
    const Tensor& dout = ctx.in("Out@GRAD");
    Tensor& dx = ctx.out("X@GRAD", saved.shape(), dout.dtype());
    cpu::binary_tensor(saved, dout, dx, Bwd{});
  };
  OpRegistry::instance().add(type, fwd);
  return OpRegistry::instance().add(grad_type, bwd);
}

}  // namespace mix
