// grad_global_norm, clip_by_global_norm and clip_by_value: shape rules and
// CPU kernels (runtime/optim/clip_grad.h says what they do; the CUDA twins are
// runtime/optim/cuda/clip_grad.cu).
#include "runtime/optim/clip_grad.h"

#include <cmath>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"

namespace mix::optim {

namespace {

// X and Out name the same FP32 variables (the ops work in place).
void check_in_place_f32(Program& p, const OpDesc& op) {
  MIX_CHECK(!op.ins("X").empty(), op.type << " of no gradients");
  MIX_CHECK(op.out_or_empty("Out").empty() || op.outs("Out") == op.ins("X"), op.type << ": Out must be X (in place)");
  for (const std::string& x : op.ins("X"))
    MIX_CHECK(p.var(x).dtype == DType::f32, op.type << ": " << x << " must be an FP32 gradient, is "
                                                    << dtype_name(p.var(x).dtype));
}

void infer_grad_global_norm(Program& p, OpDesc& op) {
  check_in_place_f32(p, op);
  declare_var(p, op.out("Norm"), {1}, DType::f32);
}

// The sum of x[i]^2 in FP64. Eight independent sums, added at the end: one
// sum's chain of dependent adds ran at an add's latency a element, several
// times slower than the momentum update beside it (the order is fixed, so
// the result is the same on every rank and run).
double sum_of_squares(const float* x, int64_t n) {
  constexpr int kLanes = 8;
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] += static_cast<double>(x[i + k]) * static_cast<double>(x[i + k]);
  for (; i < n; ++i) lane[0] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  double sum = 0;
  for (double v : lane) sum += v;
  return sum;
}

void grad_global_norm_cpu(OpContext& ctx) {
  double sum = 0;  // FP64: one rounding, to FP32, at the end
  for (const Tensor* t : ctx.ins("X")) sum += sum_of_squares(t->data<float>(), t->numel());
  ctx.out("Norm", {1}, DType::f32).data<float>()[0] = static_cast<float>(std::sqrt(sum));
}

void infer_clip_by_global_norm(Program& p, OpDesc& op) {
  check_in_place_f32(p, op);
  MIX_CHECK(op.attr<double>("max_norm", 0) > 0, op.type << ": max_norm must be positive");
  const std::string flag = op.in_or_empty("FoundInfinite");
  MIX_CHECK(flag.empty() || op.out("FoundInfiniteOut") == flag, op.type << ": FoundInfiniteOut must be FoundInfinite");
  declare_var(p, op.out("FoundInfiniteOut"), {1}, DType::i32);
}

void clip_by_global_norm_cpu(OpContext& ctx) {
  const float norm = ctx.in("Norm").data<float>()[0];
  // FoundInfiniteOut = FoundInfinite (the AMP step's flag, when there is one) OR a non-finite norm.
  const Tensor* before = ctx.in_opt("FoundInfinite");
  const int32_t found = (before ? before->data<int32_t>()[0] : 0) | (fn::is_finite(norm) ? 0 : 1);
  ctx.out("FoundInfiniteOut", {1}, DType::i32).data<int32_t>()[0] = found;
  if (!fn::is_finite(norm)) return;  // an overflow: the step is skipped, the gradients are left as they are
  const float coef = fn::clip_coefficient(norm, static_cast<float>(ctx.attr<double>("max_norm", 0)));
  for (size_t i = 0; i < ctx.op.outs("Out").size(); ++i) {
    Tensor& g = ctx.out_existing("Out", i);
    cpu::unary(g.data<float>(), g.data<float>(), g.numel(), [coef](float x) { return x * coef; });
  }
}

void infer_clip_by_value(Program& p, OpDesc& op) {
  check_in_place_f32(p, op);
  MIX_CHECK(op.attr<double>("max_value", 0) > 0, op.type << ": max_value must be positive");
}

void clip_by_value_cpu(OpContext& ctx) {
  const fn::ClipByValue f{static_cast<float>(ctx.attr<double>("max_value", 0))};
  for (size_t i = 0; i < ctx.op.outs("Out").size(); ++i) {
    Tensor& g = ctx.out_existing("Out", i);
    cpu::unary(g.data<float>(), g.data<float>(), g.numel(), f);
  }
}

MIX_REGISTER_OP("grad_global_norm", OpInfo{infer_grad_global_norm, grad_global_norm_cpu, {}, {}});
MIX_REGISTER_OP("clip_by_global_norm", OpInfo{infer_clip_by_global_norm, clip_by_global_norm_cpu, {}, {}});
MIX_REGISTER_OP("clip_by_value", OpInfo{infer_clip_by_value, clip_by_value_cpu, {}, {}});

}  // namespace

void append_grad_norm(Program& p, const std::vector<std::string>& grads) {
  OpDesc op = make_op("grad_global_norm", {{"X", grads}}, {{"Norm", {kGradNorm}}});
  op.role = OpRole::optimize;
  p.append_op(std::move(op));
}

void append_clip_by_global_norm(Program& p, const std::vector<std::string>& grads, double max_norm,
                                 const std::string& found_inf) {
  // Under AMP the step's found_inf is written before (the found_inf all-reduce): OR into it.
  std::map<std::string, std::vector<std::string>> ins{{"X", grads}, {"Norm", {kGradNorm}}};
  if (p.producer(found_inf)) ins["FoundInfinite"] = {found_inf};
  OpDesc op = make_op("clip_by_global_norm", ins, {{"Out", grads}, {"FoundInfiniteOut", {found_inf}}},
                      {{"max_norm", max_norm}});
  op.role = OpRole::optimize;
  p.append_op(std::move(op));
}

void append_clip_by_value(Program& p, const std::vector<std::string>& grads, double max_value) {
  OpDesc op = make_op("clip_by_value", {{"X", grads}}, {{"Out", grads}}, {{"max_value", max_value}});
  op.role = OpRole::optimize;
  p.append_op(std::move(op));
}

}  // namespace mix::optim
