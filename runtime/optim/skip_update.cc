// any_flag: Out (i32 [1]) = 1 when any of the i32 [1] flags in X is nonzero,
// else 0. With outlier skips (launch/outlier_detector.h) it makes the
// optimizer's SkipUpdate from the step's overflow flag and the host's
// outlier decision, so the loss scaler still sees overflows alone.
#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"

namespace mix::optim {
namespace {

void infer_any_flag(Program& p, OpDesc& op) {
  for (const std::string& x : op.ins("X"))
    MIX_CHECK(p.var(x).dtype == DType::i32 && shape_numel(p.var(x).shape) == 1,
              "any_flag: " << x << " must be one i32 flag");
  declare_var(p, op.out("Out"), {1}, DType::i32);
}

void any_flag_cpu(OpContext& ctx) {
  int32_t any = 0;
  for (const Tensor* x : ctx.ins("X")) any |= x->data<int32_t>()[0] != 0 ? 1 : 0;
  ctx.out("Out", {1}, DType::i32).data<int32_t>()[0] = any;
}

MIX_REGISTER_OP("any_flag", OpInfo{infer_any_flag, any_flag_cpu, {}, {}});

}  // namespace
}  // namespace mix::optim
