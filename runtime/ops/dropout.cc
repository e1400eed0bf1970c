// dropout with Paddle's slots and its upscale_in_train implementation (PyTorch's
// nn.Dropout): kept values are scaled by 1 / (1 - p) in training, so evaluation
// is the identity.
//   input   X (f32, f16 or bf16)
//   attrs   dropout_prob (float in [0, 1), default 0.5), seed (int64, default 0),
//           is_test (bool, default false), dropout_implementation (string,
//           "upscale_in_train" only: Paddle's default "downgrade_in_infer"
//           scales at inference instead, a different model, so it is refused)
//   outputs Out (X's dtype), Mask (u8, X's shape: 1 kept, 0 dropped; the grad
//           reads it, so it is required unless is_test)
// Training (not is_test, ExecEnv::training, p > 0): element i is kept iff
// fn::dropout_keep(key, i, p), Out = X * keep * (1 / (1 - p)) rounded once.
// The key is fn::dropout_key(seed, ExecEnv::step, ExecEnv::rank, fnv1a(Out's
// name)): a fresh mask every step, different on every rank and for every
// dropout op, and the same again when a step is rerun. The mask is a stateless
// hash of (key, i) (runtime/kernels/dropout_mask.h), so a CUDA kernel computes
// the same bits independently per element. Otherwise Out = X (a copy) and Mask = 1.
//
// Grad (dropout_grad): inputs Mask, Out@GRAD; attrs copied from the forward;
// X@GRAD = Out@GRAD * Mask / (1 - p), or Out@GRAD itself when the forward was
// the identity (decided by the same test, so ExecEnv::training must not change
// between the forward and the backward of a step).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/dropout_mask.h"
#include "runtime/ops/dropout_attrs.h"

namespace mix {
namespace {

using dropout_rules::active;
using dropout_rules::drop_prob;

void infer_dropout(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  MIX_CHECK(is_floating(x.dtype), "dropout: X " << x.name << " must be a float tensor, got " << dtype_name(x.dtype));
  drop_prob(op);
  declare_var(p, op.out("Out"), x.shape, x.dtype);
  const bool is_test = op.attr<bool>("is_test", false);
  MIX_CHECK(is_test || !op.out_or_empty("Mask").empty(),
            "dropout: output Mask is required in training (the grad reads it), or set is_test");
  if (!op.out_or_empty("Mask").empty()) declare_var(p, op.out("Mask"), x.shape, DType::u8);
}

// out[i] = f(in[i], mask[i]) in FP32 chunks, rounded to T on store.
template <typename T>
void apply_mask(const T* in, const uint8_t* mask, T* out, int64_t n, fn::DropoutApply f) {
  float buf[cpu::kChunk];
  for (int64_t b = 0; b < n; b += cpu::kChunk) {
    const int64_t m = std::min(cpu::kChunk, n - b);
    cpu::load_floats(in + b, buf, m);
    for (int64_t i = 0; i < m; ++i) buf[i] = f(buf[i], mask[b + i]);
    cpu::store_floats(buf, out + b, m);
  }
}

void dropout_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const float p = drop_prob(ctx.op);
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  std::vector<uint8_t> mask_tmp;
  uint8_t* mask = nullptr;
  if (ctx.wants("Mask")) {
    mask = ctx.out("Mask", x.shape(), DType::u8).data<uint8_t>();
  } else {
    mask_tmp.resize(static_cast<size_t>(x.numel()));
    mask = mask_tmp.data();
  }
  const int64_t n = x.numel();
  if (!active(ctx, p)) {
    if (n > 0) std::memcpy(out.raw(), x.raw(), x.bytes());
    std::fill(mask, mask + n, uint8_t{1});
    return;
  }
  // The step from ExecEnv::device_step when set (host memory, on the CPU).
  const int64_t step = ctx.env.device_step ? *ctx.env.device_step : ctx.env.step;
  const uint64_t key = dropout_rules::mask_key(ctx, step);
  for (int64_t i = 0; i < n; ++i) mask[i] = fn::dropout_keep(key, static_cast<uint64_t>(i), p) ? 1 : 0;
  cpu::dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    apply_mask(x.data<T>(), mask, out.data<T>(), n, fn::DropoutApply{fn::dropout_scale(p)});
  });
}

void dropout_grad_cpu(OpContext& ctx) {
  const Tensor& mask = ctx.in("Mask");
  const Tensor& dout = ctx.in("Out@GRAD");
  dropout_rules::check_grad_inputs(mask, dout);
  const float p = drop_prob(ctx.op);
  Tensor& dx = ctx.out("X@GRAD", dout.shape(), dout.dtype());
  if (!active(ctx, p)) {
    if (dout.numel() > 0) std::memcpy(dx.raw(), dout.raw(), dout.bytes());
    return;
  }
  cpu::dispatch_floating(dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    apply_mask(dout.data<T>(), mask.data<uint8_t>(), dx.data<T>(), dout.numel(),
               fn::DropoutApply{fn::dropout_scale(p)});
  });
}

std::vector<OpDesc> dropout_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dx = g.grad_for_input(fwd.in("X"));
  if (dx.empty()) return {};
  MIX_CHECK(!fwd.out_or_empty("Mask").empty(),
            "dropout: output Mask is needed for the gradient (of " << fwd.out("Out") << ")");
  return {make_op("dropout_grad", {{"Mask", {fwd.out("Mask")}}, {"Out@GRAD", {g.grad_of_output(fwd.out("Out"))}}},
                  {{"X@GRAD", {dx}}}, fwd.attrs)};
}

MIX_REGISTER_OP("dropout", OpInfo{infer_dropout, dropout_cpu, {}, dropout_grad_maker, {}, /*varies_by_step=*/true});
MIX_REGISTER_OP("dropout_grad", OpInfo{{}, dropout_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
