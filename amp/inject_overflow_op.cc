// inject_overflow: the --inject-overflow testing aid. At optimizer step `step`
// on rank `rank` (-1: all), and with `micro_batch` set in that micro-batch of
// the step only (0-based, --grad-accum-steps), writes +inf into the first
// element of every input, so a test can watch every rank skip that step
// together. After each bucket's all-reduce it hits the reduced gradients of
// one rank; on loss@GRAD, one micro-batch's whole backward.
#include <limits>

#include "collective/communicator.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/gemm.h"

namespace mix::amp {
namespace {

void inject_overflow_cpu(OpContext& ctx) {
  const int64_t step = ctx.attr<int64_t>("step", 0);
  const int rank = ctx.attr<int>("rank", -1);
  const int my_rank = ctx.env.comm ? ctx.env.comm->rank() : 0;
  // The step from ExecEnv::device_step when set (host memory, on the CPU).
  const int64_t now = ctx.env.device_step ? *ctx.env.device_step : ctx.env.step;
  if (now != step || (rank >= 0 && rank != my_rank)) return;
  const int64_t micro_batch = ctx.attr<int64_t>("micro_batch", -1);
  if (micro_batch >= 0 && micro_batch != ctx.env.micro_batch) return;
  for (size_t i = 0; i < ctx.op.outs("Out").size(); ++i) {
    Tensor& g = ctx.out_existing("Out", i);
    if (g.numel() == 0) continue;
    const float inf = std::numeric_limits<float>::infinity();
    Tensor one = g.reshaped({g.numel()});
    std::vector<float> v = one.to_floats();
    v[0] = inf;
    cpu::store_f32(v.data(), one);
  }
}

MIX_REGISTER_OP("inject_overflow", OpInfo{{}, inject_overflow_cpu, {}, {}, {}, /*varies_by_step=*/true});

}  // namespace
}  // namespace mix::amp
