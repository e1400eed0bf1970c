// increment_step: optimizer.step += 1 unless the step is skipped. Every
// optimizer appends it before its updates (AdamW reads the new count t).
#include "runtime/optim/update_op.h"

namespace mix::optim {
namespace {

void increment_step_cpu(OpContext& ctx) {
  if (skip_this_step(ctx)) return;
  ctx.out_existing("StepOut").data<int64_t>()[0] += 1;
}

MIX_REGISTER_OP("increment_step", OpInfo{{}, increment_step_cpu, {}, {}});

}  // namespace
}  // namespace mix::optim
