// cast: converts between dtypes (f32 <-> f16/bf16, and ints). amp::rewrite
// inserts these; the gradient of a cast is the cast back.
#include <cstring>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/gemm.h"

namespace mix {
namespace {

DType out_dtype(const OpDesc& op) { return parse_dtype(op.attr<std::string>("out_dtype", "f32")); }

void infer_cast(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  declare_var(p, op.out("Out"), x.shape, out_dtype(op));
}

template <typename From, typename To>
void cast_ints(const Tensor& x, Tensor& out) {
  const From* src = x.data<From>();
  To* dst = out.data<To>();
  for (int64_t i = 0; i < x.numel(); ++i) dst[i] = static_cast<To>(src[i]);
}

void cast_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const DType to = out_dtype(ctx.op);
  Tensor& out = ctx.out("Out", x.shape(), to);
  if (x.dtype() == to) {
    if (x.bytes()) std::memcpy(out.raw(), x.raw(), x.bytes());
    return;
  }
  if (is_floating(x.dtype()) && is_floating(to)) {
    cpu::store_f32(cpu::as_f32(x, 3), out);
    return;
  }
  if (x.dtype() == DType::i64 && to == DType::i32) return cast_ints<int64_t, int32_t>(x, out);
  if (x.dtype() == DType::i32 && to == DType::i64) return cast_ints<int32_t, int64_t>(x, out);
  if (x.dtype() == DType::i64 && to == DType::f32) return cast_ints<int64_t, float>(x, out);
  MIX_FAIL("cast from " << dtype_name(x.dtype()) << " to " << dtype_name(to) << " is not supported");
}

std::vector<OpDesc> cast_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dx = g.grad_for_input(fwd.in("X"));
  if (dx.empty()) return {};
  const DType in_dtype = g.program.var(fwd.in("X")).dtype;
  return {make_op("cast", {{"X", {g.grad_of_output(fwd.out("Out"))}}}, {{"Out", {dx}}},
                  {{"out_dtype", std::string(dtype_name(in_dtype))}})};
}

MIX_REGISTER_OP("cast", OpInfo{infer_cast, cast_cpu, {}, cast_grad_maker});

}  // namespace
}  // namespace mix
