// grad_accumulate's shape rules and CPU kernel (runtime/ops/grad_accumulate.h
// says what it does; its CUDA twin is runtime/ops/cuda/grad_accumulate.cu).
#include "runtime/ops/grad_accumulate.h"

#include <algorithm>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"

namespace mix {

bool grad_accumulate_finishes(const OpDesc& op) {
  const std::string mode = op.attr<std::string>("mode", "");
  MIX_CHECK(mode == "add" || mode == "finish", "grad_accumulate: mode must be add or finish, got '" << mode << "'");
  return mode == "finish";
}

namespace {

void infer_grad_accumulate(Program& p, OpDesc& op) {
  grad_accumulate_finishes(op);
  const auto& xs = op.ins("X");
  const auto& accs = op.ins("Accum");
  MIX_CHECK(xs.size() == accs.size() && op.outs("AccumOut") == accs,
            "grad_accumulate: X and Accum must pair up, and AccumOut must be Accum (in place)");
  for (size_t i = 0; i < xs.size(); ++i) {
    const VarDesc& x = p.var(xs[i]);
    const VarDesc& a = p.var(accs[i]);
    MIX_CHECK(x.dtype == p.var(xs[0]).dtype, "grad_accumulate: X mixes dtypes (" << xs[i] << " is "
                                                                               << dtype_name(x.dtype) << "), as a "
                                                                               << "bucket never does");
    MIX_CHECK(a.dtype == DType::f32 && shape_numel(a.shape) == shape_numel(x.shape),
              "grad_accumulate: " << accs[i] << " must be FP32 of " << xs[i] << "'s size");
  }
  if (grad_accumulate_finishes(op)) MIX_CHECK(op.outs("Out") == xs, "grad_accumulate finish: Out must be X (in place)");
}

// Accum += X, chunk by chunk (X widened to float as it is read).
template <typename T>
void add_into(const T* x, float* acc, int64_t n) {
  float buf[cpu::kChunk];
  for (int64_t b = 0; b < n; b += cpu::kChunk) {
    const int64_t m = std::min(cpu::kChunk, n - b);
    cpu::load_floats(x + b, buf, m);
    for (int64_t j = 0; j < m; ++j) acc[b + j] = fn::Add{}(acc[b + j], buf[j]);
  }
}

// X = Accum + X, rounded to X's dtype once; Accum = 0.
template <typename T>
void finish_into(T* x, float* acc, int64_t n) {
  float buf[cpu::kChunk];
  for (int64_t b = 0; b < n; b += cpu::kChunk) {
    const int64_t m = std::min(cpu::kChunk, n - b);
    cpu::load_floats(x + b, buf, m);
    for (int64_t j = 0; j < m; ++j) {
      buf[j] = fn::Add{}(acc[b + j], buf[j]);
      acc[b + j] = 0.f;
    }
    cpu::store_floats(buf, x + b, m);
  }
}

void grad_accumulate_cpu(OpContext& ctx) {
  const bool finish = grad_accumulate_finishes(ctx.op);
  for (size_t i = 0; i < ctx.op.ins("X").size(); ++i) {
    Tensor& acc = ctx.out_existing("AccumOut", i);
    const Tensor& x = *ctx.ins("X")[i];
    MIX_CHECK(acc.dtype() == DType::f32 && acc.numel() == x.numel(),
              "grad_accumulate: " << ctx.op.ins("Accum")[i] << " does not match " << ctx.op.ins("X")[i]);
    cpu::dispatch_floating(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if (finish)
        finish_into(ctx.out_existing("Out", i).data<T>(), acc.data<float>(), x.numel());
      else
        add_into(x.data<T>(), acc.data<float>(), x.numel());
    });
  }
}

MIX_REGISTER_OP("grad_accumulate", OpInfo{infer_grad_accumulate, grad_accumulate_cpu, {}, {}});

}  // namespace
}  // namespace mix
