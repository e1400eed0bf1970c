#include "launch/train_program.h"

#include <algorithm>
#include <functional>
#include <sstream>

#include "amp/fold_casts.h"
#include "amp/fuse_param_casts.h"
#include "amp/lists.h"
#include "amp/rewrite.h"
#include "collective/elide_single_rank_sync.h"
#include "collective/grad_accumulation_pass.h"
#include "launch/worker_main.h"
#include "runtime/core/check.h"
#include "runtime/ir/autodiff.h"
#include "runtime/ir/op_registry.h"
#include "runtime/optim/clip_grad.h"
#include "runtime/passes/fold_grad_sums.h"
#include "runtime/passes/fuse_add_layer_norm.h"
#include "runtime/passes/fuse_add_relu.h"
#include "runtime/passes/fuse_bn_relu.h"
#include "runtime/passes/fuse_matmul_bias.h"
#include "runtime/passes/recompute_softmax.h"

namespace mix::launch {

using amp::Precision;

collective::GradReduce default_grad_reduce(Precision precision) {
  switch (precision) {
    case Precision::amp: return collective::GradReduce::fp16;
    // BF16's 8-bit mantissa loses more per hop than FP16's; docs/design.md ("BF16") has the figures.
    case Precision::bf16: return collective::GradReduce::fp32;
    case Precision::fp32: break;
  }
  return collective::GradReduce::fp32;
}

std::string grad_reduce_conflict(Precision precision, collective::GradReduce reduce) {
  if (reduce == collective::GradReduce::fp16 && precision != Precision::amp)
    return "--grad-reduce fp16 needs --precision amp (" +
           std::string(precision == Precision::bf16 ? "BF16 training reduces bf16 or fp32" : "FP32 training has no FP16 gradients to reduce") +
           ")";
  if (reduce == collective::GradReduce::bf16 && precision != Precision::bf16)
    return "--grad-reduce bf16 needs --precision bf16 (" +
           std::string(precision == Precision::amp ? "AMP training reduces fp16 or fp32" : "FP32 training has no BF16 gradients to reduce") +
           ")";
  return "";
}

std::string TrainProgram::describe_passes() const {
  std::ostringstream o;
  o << "passes, in order (launch/train_program.cc):\n";
  int n = 0;
  for (const PassRun& p : passes) {
    o << "  " << ++n << ". " << p.name << " (" << p.file << ")";
    if (!p.ran)
      o << ": off, " << p.off_by;
    else if (!p.result.empty())
      o << ": " << p.result;
    o << "\n";
  }
  return o.str();
}

namespace {

// The AMP step computes the loss in FP32: its gradient is seeded with the
// loss scale, which FP16 holds only up to 65504 (the pytorch preset starts at
// 65536). A custom white list can still put the op that computes it in FP16.
void check_loss_is_fp32(const Program& p, const std::string& loss, const AmpSettings& a) {
  if (p.var(loss).dtype == DType::f32) return;
  const std::optional<size_t> producer = p.producer(loss);
  const std::string op = producer ? p.ops()[*producer].type : std::string("?");
  const bool listed = std::find(a.custom_white.begin(), a.custom_white.end(), op) != a.custom_white.end();
  throw UsageError((listed ? "--amp-white-list " + op : "op " + op) + " computes the loss '" + loss + "' in " +
                   std::string(dtype_name(p.var(loss).dtype)) +
                   "; AMP keeps the loss FP32 (its gradient starts at the loss scale): " +
                   (listed ? "take " + op + " off --amp-white-list" : "put " + op + " in --amp-black-list"));
}

// What a pass did: a few words for --print-program, and whether it changed anything.
struct Did {
  std::string what;
  bool changed = true;
};

// One step of the pipeline: `run` rewrites the program and says what it did.
// `off_by` non-empty: it does not run, and says why. A whole-step rewrite
// names the flag that turns it off.
struct Pass {
  std::string name, file, off_by;
  std::function<Did()> run;
  std::string whole_step_flag = "";
};

// The gradient variables of (parameter, gradient) pairs.
std::vector<std::string> grad_vars(const optim::ParamGrads& pgs) {
  std::vector<std::string> v;
  for (const auto& [param, grad] : pgs) v.push_back(grad);
  return v;
}

// "3 casts folded" ("1 cast folded"), changed when n > 0.
Did count(int n, const std::string& one, const std::string& many) {
  return {std::to_string(n) + " " + (n == 1 ? one : many), n > 0};
}
// "2 forward and 3 backward pairs".
Did pairs(int forward, int backward) {
  return {std::to_string(forward) + " forward and " + std::to_string(backward) + " backward pairs",
          forward + backward > 0};
}

}  // namespace

TrainProgram build_train_program(Program& p, const std::string& loss, const TrainProgramOptions& o) {
  const bool amp = amp::is_mixed(o.precision);  // amp or bf16: the AMP passes run
  const collective::GradReduce reduce = o.grad_reduce.value_or(default_grad_reduce(o.precision));
  if (const std::string why = grad_reduce_conflict(o.precision, reduce); !why.empty()) throw UsageError(why);
  MIX_CHECK(p.has_var(loss), "the forward program has no loss variable '" << loss << "'");
  const int64_t K = o.grad_accum_steps;
  MIX_CHECK(K >= 1, "grad_accum_steps must be at least 1, got " << K);
  MIX_CHECK(K == 1 || o.grad_sync, "gradient accumulation needs the data-parallel pass (the accumulators sit "
                                   "before each bucket's all-reduce)");
  if (o.clip_grad_norm && o.clip_grad_value)
    throw UsageError("--clip-grad-norm and --clip-grad-value are two ways to clip: use one");
  if ((o.clip_grad_norm && !(*o.clip_grad_norm > 0)) || (o.clip_grad_value && !(*o.clip_grad_value > 0)))
    throw UsageError("--clip-grad-norm and --clip-grad-value take a positive bound");

  TrainProgram t;
  t.loss = loss;
  t.grad_accum_steps = K;
  t.read_back = o.read_back;
  t.read_back.insert(loss);
  if (amp) {
    t.found_inf = amp::ScalerVars::found_inf;
    t.read_back.insert({amp::ScalerVars::found_inf, amp::ScalerVars::overflow_ranks});
  }
  const amp::AmpLists lists = amp::AmpLists::defaults().with_custom(o.amp.custom_white, o.amp.custom_black);
  std::unique_ptr<optim::Optimizer> optimizer = optim::make_optimizer(o.optimizer);
  amp::LocalFoundInf local_found_inf;
  std::string update_skip;  // the optimizer's SkipUpdate when it is not found_inf
  const std::string fp32 = "--precision " + std::string(amp::to_string(o.precision));
  auto amp_only = [&](const char* flag_off, bool on) { return !amp ? fp32 : on ? std::string() : flag_off; };
  const std::string no_sync = "no data-parallel pass";
  // Pass 24 runs on one rank, where the data-parallel pass put all-reduces in.
  auto single_rank_off = [&]() -> std::string {
    if (!o.grad_sync) return no_sync;
    if (o.grad_sync->world_size > 1) return std::to_string(o.grad_sync->world_size) + " ranks";
    return o.passes.elide_single_rank_sync ? "" : "--no-elide-single-rank-sync";
  };

  // The AMP step, in order. Under --precision fp32 the AMP passes are off and
  // the rest is the FP32 step: forward, backward, all-reduce, optimizer.
  const std::vector<Pass> pipeline = {
      // Forward: the model's program, built by models/.
      // Precision: white ops in FP16, black in FP32, gray follow their inputs; casts inserted.
      {"amp::rewrite: casts by the AMP lists", "amp/rewrite.cc", amp_only("", true),
       [&] {
         const amp::RewriteResult r = amp::rewrite(p, lists, amp::low_dtype(o.precision));
         return count(r.casts_inserted, "cast", "casts");
       }},
      {"amp::fold_widening_casts: softmax, cross-entropy and residual adds read the low-precision tensor",
       "amp/fold_casts.cc", amp_only("--no-fold-casts", o.amp.fold_casts),
       [&] { return count(amp::fold_widening_casts(p), "cast folded", "casts folded"); }},
      {"amp::fold_casts_into_producers: image_normalize and layer_norm store the low-precision output",
       "amp/fold_casts.cc", amp_only("--no-fold-casts", o.amp.fold_casts),
       [&] { return count(amp::fold_casts_into_producers(p), "cast folded", "casts folded"); }},
      // The loss gradient: the loss scale under AMP (the scaler's state is declared here), 1 in FP32.
      {amp ? "seed_loss_gradient: loss@GRAD = the loss scale" : "seed_loss_gradient: loss@GRAD = 1",
       amp ? "runtime/ir/autodiff.cc, amp/loss_scaler.cc" : "runtime/ir/autodiff.cc", "",
       [&] {
         // K micro-batches: each loss counts 1/K, so their summed gradients are a K-fold batch's.
         const double per_micro_batch = 1.0 / static_cast<double>(K);
         const std::string times_1_over_k = K > 1 ? ", times 1/" + std::to_string(K) : "";
         if (!amp) {
           seed_loss_gradient(p, loss, "", per_micro_batch);
           return Did{times_1_over_k.empty() ? "" : times_1_over_k.substr(2)};
         }
         check_loss_is_fp32(p, loss, o.amp);
         amp::declare_scaler_state(p, o.amp.scaler);
         seed_loss_gradient(p, loss, amp::ScalerVars::scale, per_micro_batch);
         if (o.amp.inject && o.amp.inject->micro_batch >= 0)
           amp::inject_loss_gradient_overflow(p, loss + "@GRAD", *o.amp.inject);
         std::ostringstream s;
         s << amp::mode_name(o.amp.scaler.mode) << " scaler, initial scale " << amp::initial_state(o.amp.scaler).scale
           << times_1_over_k;
         return Did{s.str()};
       }},
      // Backward: each op's gradient ops, registered beside it.
      {"append_backward: autodiff", "runtime/ir/autodiff.cc", "",
       [&] {
         t.backward_grads = append_backward(p, loss).param_grads;
         t.param_grads = t.backward_grads;
         return count(static_cast<int>(t.backward_grads.size()), "parameter gradient", "parameter gradients");
       }},
      {"amp::fold_widening_grad_casts: softmax_grad reads the low-precision gradient", "amp/fold_casts.cc",
       amp_only("--no-fold-casts", o.amp.fold_casts),
       [&] { return count(amp::fold_widening_grad_casts(p), "cast folded", "casts folded"); }},
      // The gradient all-reduce: bucketed, overlapping backward; under AMP
      // the FP16 gradients travel, cast to FP32 after (--grad-reduce fp16).
      {"insert_grad_allreduce: gradient all-reduce in " + std::string(collective::to_string(reduce)),
       "collective/grad_allreduce_pass.cc", o.grad_sync ? "" : no_sync,
       [&] {
         t.param_grads = collective::insert_grad_allreduce(p, t.backward_grads, reduce, *o.grad_sync, &t.buckets);
         return count(static_cast<int>(t.buckets.size()), "bucket", "buckets");
       }},
      // K micro-batches: the gradients of the K - 1 before the last summed in
      // FP32, added in right before each bucket's all-reduce, which runs once.
      {"insert_grad_accumulation: gradients summed over " + (K > 1 ? std::to_string(K) : std::string("several")) +
           " micro-batches, all-reduced once",
       "collective/grad_accumulation_pass.cc", K > 1 ? "" : "--grad-accum-steps 1",
       [&] { return count(collective::insert_grad_accumulation(p), "gradient", "gradients"); }},
      // Unscale by 1/scale into the FP32 gradients, and the local finite check.
      {"amp::insert_unscale: check_finite_and_unscale per bucket", "amp/unscale_pass.cc", amp_only("", true),
       [&] {
         // A micro-batch's overflow went into its loss gradient (above), not here.
         const bool after_allreduce = o.amp.inject && o.amp.inject->micro_batch < 0;
         local_found_inf = amp::insert_unscale(p, t.param_grads, after_allreduce ? o.amp.inject : std::nullopt);
         return count(static_cast<int>(local_found_inf.flags.size()), "unscale op", "unscale ops");
       }},
      // Every rank takes the same decision.
      {"amp::append_found_inf_allreduce: found_inf all-reduced (max)", "amp/unscale_pass.cc", amp_only("", true),
       [&] {
         amp::append_found_inf_allreduce(p, local_found_inf, o.grad_sync ? o.grad_sync->world_size : 1);
         return Did();
       }},
      // The gradients' L2 norm (the metrics' grad_norm), and the clips that use
      // it or bound each value: the same on every rank, as the gradients are.
      {"grad_global_norm: grad_norm, the L2 norm of the FP32 gradients", "runtime/optim/clip_grad.cc", "",
       [&] {
         optim::append_grad_norm(p, grad_vars(t.param_grads));
         t.read_back.insert(optim::kGradNorm);
         return Did{};
       }},
      {"clip_by_global_norm: gradients times min(1, C / (grad_norm + 1e-6))", "runtime/optim/clip_grad.cc",
       o.clip_grad_norm ? "" : "no --clip-grad-norm",
       [&] {
         if (t.found_inf.empty()) t.found_inf = amp::ScalerVars::found_inf;  // FP32: the clip's own flag
         t.read_back.insert(t.found_inf);
         optim::append_clip_by_global_norm(p, grad_vars(t.param_grads), *o.clip_grad_norm, t.found_inf);
         std::ostringstream s;
         s << "C = " << *o.clip_grad_norm << "; a non-finite norm skips the step";
         return Did{s.str()};
       }},
      {"clip_by_value: gradients clamped to [-V, V]", "runtime/optim/clip_grad.cc",
       o.clip_grad_value ? "" : "no --clip-grad-value",
       [&] {
         optim::append_clip_by_value(p, grad_vars(t.param_grads), *o.clip_grad_value);
         std::ostringstream s;
         s << "V = " << *o.clip_grad_value;
         return Did{s.str()};
       }},
      // The scaler's update, from the global flag.
      {"amp::append_update_loss_scaling: the loss scale's update", "amp/loss_scaler.cc", amp_only("", true),
       [&] {
         amp::append_update_loss_scaling(p, o.amp.scaler);
         return Did();
       }},
      // With outlier skips, the update's own flag: an overflow or the host's outlier decision.
      {"any_flag: the update is skipped on an overflow or an outlier", "runtime/optim/skip_update.cc",
       o.outlier_skips ? "" : "no --skip-loss-zscore or --skip-grad-norm-zscore",
       [&] {
         VarDesc v{kOutlierSkip, {1}, DType::i32, false, false, true, {}};
         p.add_var(v);
         std::vector<std::string> flags = {kOutlierSkip};
         if (!t.found_inf.empty()) flags.insert(flags.begin(), t.found_inf);
         OpDesc any = make_op("any_flag", {{"X", flags}}, {{"Out", {kSkipUpdate}}});
         any.role = OpRole::optimize;
         p.append_op(std::move(any));
         update_skip = kSkipUpdate;
         return Did{"the host decides between the two parts of the step"};
       }},
      // The optimizer updates the FP32 masters, or nothing on an overflow step.
      {"optimizer: " + std::string(optim::to_string(o.optimizer.kind)) + " updates", "runtime/optim/optimizer.cc", "",
       [&] {
         optimizer->append_update_ops(p, t.param_grads, update_skip.empty() ? t.found_inf : update_skip);
         return Did{amp ? "skipped when found_inf" : ""};
       }},
      // Whole-step rewrites: the same values, less memory traffic.
      {"recompute_softmax: cross-entropy's gradient recomputes the softmax", "runtime/passes/recompute_softmax.cc",
       o.passes.recompute_softmax ? "" : "--store-softmax",
       [&] { return count(recompute_softmax(p, t.read_back), "loss", "losses"); }, "--store-softmax"},
      {"fuse_add_relu: elementwise_add + relu as one op", "runtime/passes/fuse_add_relu.cc",
       o.passes.fuse_add_relu ? "" : "--no-fuse-add-relu",
       [&] {
         const FusedAddRelu f = fuse_add_relu(p, t.read_back);
         return pairs(f.forward, f.backward);
       },
       "--no-fuse-add-relu"},
      {"amp::fuse_param_casts: the weights' low-precision casts as one op", "amp/fuse_param_casts.cc",
       amp_only("--no-fuse-param-casts", o.passes.fuse_param_casts),
       [&] { return count(amp::fuse_param_casts(p), "cast fused", "casts fused"); }, "--no-fuse-param-casts"},
      // After fuse_param_casts: until then a bias's FP16 cast sits between its matmul and add.
      {"fuse_matmul_bias: a linear layer's product + bias add as one op", "runtime/passes/fuse_matmul_bias.cc",
       o.passes.fuse_matmul_bias ? "" : "--no-fuse-matmul-bias",
       [&] { return count(fuse_matmul_bias(p, t.read_back), "pair", "pairs"); }, "--no-fuse-matmul-bias"},
      {"fuse_bn_relu: batch_norm + relu as one op", "runtime/passes/fuse_bn_relu.cc",
       o.passes.fuse_bn_relu ? "" : "--no-fuse-bn-relu",
       [&] {
         const FusedBnRelu f = fuse_bn_relu(p, t.read_back);
         return pairs(f.forward + f.forward_add, f.backward);
       },
       "--no-fuse-bn-relu"},
      {"fold_grad_sums: a gradient's two parts added by the op that writes the second",
       "runtime/passes/fold_grad_sums.cc", o.passes.fold_grad_sums ? "" : "--no-fold-grad-sums",
       [&] {
         const FoldedGradSums f = fold_grad_sums(p, t.read_back);
         Did did = count(f.sums, "sum", "sums");
         if (f.casts > 0) did.what += " and " + count(f.casts, "cast", "casts").what;
         return did;
       },
       "--no-fold-grad-sums"},
      {"fuse_add_layer_norm: a residual add + the layer_norm reading it as one op",
       "runtime/passes/fuse_add_layer_norm.cc", o.passes.fuse_add_layer_norm ? "" : "--no-fuse-add-layer-norm",
       [&] { return count(fuse_add_layer_norm(p), "pair", "pairs"); }, "--no-fuse-add-layer-norm"},
      // Last: the unscale and the accumulation found the buckets by their all-reduces.
      {"elide_single_rank_sync: one rank's gradient all-reduces taken out", "collective/elide_single_rank_sync.cc",
       single_rank_off(),
       [&] { return count(collective::elide_single_rank_sync(p), "bucket's all-reduce", "buckets' all-reduces"); },
       "--no-elide-single-rank-sync"},
  };
  for (const Pass& pass : pipeline) {
    PassRun r{pass.name, pass.file, pass.off_by.empty(), pass.off_by, "", pass.whole_step_flag, false};
    if (r.ran) {
      const Did did = pass.run();
      r.result = did.what;
      r.changed = did.changed;
    }
    t.passes.push_back(std::move(r));
  }
  // After every pass, so that the micro-batches run the step's forward and backward ops.
  if (K > 1) t.micro_batch_program = collective::micro_batch_program(p);
  // Found after the whole-step passes, which add and remove forward and backward ops.
  if (o.outlier_skips) {
    const auto any = std::find_if(p.ops().begin(), p.ops().end(), [](const OpDesc& op) { return op.type == "any_flag"; });
    MIX_CHECK(any != p.ops().end(), "outlier skips: the program has no any_flag op");
    t.update_from = static_cast<size_t>(any - p.ops().begin());
  }
  return t;
}

Program TrainProgram::part(const Program& step, size_t begin, size_t end) {
  Program part = step;
  part.ops() = std::vector<OpDesc>(step.ops().begin() + static_cast<std::ptrdiff_t>(begin),
                                   step.ops().begin() + static_cast<std::ptrdiff_t>(end));
  return part;
}

}  // namespace mix::launch
