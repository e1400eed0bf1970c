// fill_constant: Out = value (seeds loss@GRAD with 1 in FP32 training).
// fill_like_scalar: Out[shape] = X[0] * multiplier (seeds loss@GRAD with the
// loss scale; multiplier 1/K under gradient accumulation, computed in FP32).
#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/gemm.h"

namespace mix {
namespace {

void fill_tensor(Tensor& t, float value) {
  std::vector<float> v(static_cast<size_t>(t.numel()), value);
  cpu::store_f32(v.data(), t);
}

void infer_fill_constant(Program& p, OpDesc& op) {
  declare_var(p, op.out("Out"), op.attr<std::vector<int64_t>>("shape", {1}),
              parse_dtype(op.attr<std::string>("dtype", "f32")));
}

void fill_constant_cpu(OpContext& ctx) {
  Tensor& out = ctx.out("Out", ctx.attr<std::vector<int64_t>>("shape", {1}),
                        parse_dtype(ctx.attr<std::string>("dtype", "f32")));
  fill_tensor(out, ctx.attr<float>("value", 0.f));
}

void infer_fill_like_scalar(Program& p, OpDesc& op) {
  declare_var(p, op.out("Out"), op.attr<std::vector<int64_t>>("shape", {1}), p.var(op.in("X")).dtype);
}

void fill_like_scalar_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  Tensor& out = ctx.out("Out", ctx.attr<std::vector<int64_t>>("shape", {1}), x.dtype());
  fill_tensor(out, x.item_float(0) * ctx.attr<float>("multiplier", 1.f));
}

MIX_REGISTER_OP("fill_constant", OpInfo{infer_fill_constant, fill_constant_cpu, {}, {}});
MIX_REGISTER_OP("fill_like_scalar", OpInfo{infer_fill_like_scalar, fill_like_scalar_cpu, {}, {}});

}  // namespace
}  // namespace mix
