// sum: Out = X0 + X1 + ... (autodiff accumulates gradient contributions with it).
// Adds in FP32 and rounds once on store, so FP16 gradients lose no extra bits.
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/gemm.h"
#include "runtime/ops/sum.h"

namespace mix {

std::vector<float> sum_in_f32(const std::vector<const Tensor*>& xs, const std::string& op) {
  MIX_CHECK(!xs.empty(), op << " of no inputs");
  const Tensor& first = *xs[0];
  std::vector<float> acc = first.to_floats();
  for (size_t k = 1; k < xs.size(); ++k) {
    MIX_CHECK(xs[k]->numel() == first.numel() && xs[k]->dtype() == first.dtype(),
              op << ": input " << k << " " << dtype_name(xs[k]->dtype()) << shape_str(xs[k]->shape())
                 << " does not match " << dtype_name(first.dtype()) << shape_str(first.shape()));
    const float* v = cpu::as_f32(*xs[k], 4);
    for (size_t i = 0; i < acc.size(); ++i) acc[i] += v[i];
  }
  return acc;
}

namespace {

void infer_sum(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.ins("X").at(0));
  declare_var(p, op.out("Out"), x.shape, x.dtype);
}

void sum_cpu(OpContext& ctx) {
  auto xs = ctx.ins("X");
  const std::vector<float> acc = sum_in_f32(xs, "sum");
  // The output may alias an input (in-place accumulation): all inputs are read above.
  Shape shape = xs[0]->shape();
  DType dtype = xs[0]->dtype();
  Tensor& out = ctx.out("Out", shape, dtype);
  cpu::store_f32(acc.data(), out);
}

// d(X0 + X1 + ...)/dXk = 1: each wanted input gradient is a copy of dOut
// (scale 1 copies; the gradient of Xk has Xk's dtype, which is dOut's).
std::vector<OpDesc> sum_grad_maker(const OpDesc& fwd, GradContext& g) {
  std::vector<OpDesc> ops;
  const std::string dout = g.grad_of_output(fwd.out("Out"));
  for (auto& x : fwd.ins("X")) {
    const std::string dx = g.grad_for_input(x);
    if (!dx.empty()) ops.push_back(make_op("scale", {{"X", {dout}}}, {{"Out", {dx}}}, {{"scale", 1.0}, {"bias", 0.0}}));
  }
  return ops;
}

MIX_REGISTER_OP("sum", OpInfo{infer_sum, sum_cpu, {}, sum_grad_maker});

}  // namespace
}  // namespace mix
