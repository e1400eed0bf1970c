#pragma once
// amp::decorate — the one-line switch from FP32 to mixed-precision training:
//
//   auto opt = optim::make_momentum(0.9);
//   opt = amp::decorate(std::move(opt), amp_options);   // the one line
//   auto train = opt->minimize(program, loss, collective::grad_allreduce_pass(sync));
//
// The decorated optimizer's minimize() runs the AMP passes around the wrapped
// optimizer: amp::rewrite (casts), amp::fold_widening_casts (the casts that
// softmax and cross-entropy do not need), the loss gradient seeded with the loss scale,
// autodiff, amp::fold_widening_grad_casts (the cast before softmax_grad), the
// gradient sync pass, the unscale of each gradient bucket right
// after its all-reduce completes (fused with the cast to FP32 when the bucket
// is FP16), the all-reduce of found_inf with its provenance (which parameters
// overflowed on which ranks), update_loss_scaling, and then the wrapped
// optimizer's updates, all skipped on an overflow step.
#include <memory>
#include <optional>
#include <string>

#include "amp/lists.h"
#include "amp/loss_scaler.h"
#include "runtime/ir/op_registry.h"
#include "runtime/optim/optimizer.h"

namespace mix::amp {

/// Names of the loss-scaler state variables (persistable; saved in checkpoints).
struct ScalerVars {
  static constexpr const char* scale = "loss_scaling";
  static constexpr const char* good_steps = "loss_scaling.good_steps";
  static constexpr const char* bad_steps = "loss_scaling.bad_steps";
  static constexpr const char* skipped = "loss_scaling.skipped_steps";
  static constexpr const char* skips_at_min = "loss_scaling.consecutive_skips_at_min";
  static constexpr const char* found_inf = "found_inf";
  /// Which ranks overflowed, overall and per parameter (collective/overflow_mask.h).
  static constexpr const char* overflow_ranks = "found_inf.ranks";
};

/// Testing aid (--inject-overflow STEP[:RANK[:PARAM]]): at optimizer step
/// `step`, make the gradients of rank `rank` (-1: every rank) non-finite,
/// all of them or only `param`'s. Injected after each bucket's all-reduce
/// (before its unscale), so only that rank sees it locally and the found_inf
/// all-reduce must carry it, with the parameter's name and the rank.
struct InjectOverflow {
  int64_t step = 0;
  int rank = -1;
  std::string param;
};

struct AmpOptions {
  AmpLists lists = AmpLists::defaults();
  LossScalerConfig scaler = preset("paddle");
  DType low_dtype = DType::f16;
  /// Run amp::fold_widening_casts after amp::rewrite and
  /// amp::fold_widening_grad_casts after autodiff (amp/fold_casts.h): the same
  /// values, without FP32 copies of softmax and cross-entropy inputs and of
  /// softmax's output gradient.
  /// Off: amp::rewrite's program as Paddle makes it (--no-fold-casts).
  bool fold_casts = true;
  std::optional<InjectOverflow> inject;
  /// Ranks the overflow-provenance mask has room for (c_allreduce_found_inf);
  /// the trainer passes its world size.
  int world_size = 1;
};

std::unique_ptr<optim::Optimizer> decorate(std::unique_ptr<optim::Optimizer> inner, AmpOptions options = {});

/// Declares the scaler's persistable state in `p`, initialised from `config`.
void declare_scaler_state(Program& p, const LossScalerConfig& config);

/// The scaler's state as its variables in `scope` hold it (on the host or a
/// device): what a checkpoint saves and the ranks' consistency check compares.
LossScalerState read_scaler_state(const Scope& scope);

/// Sets the scaler's variables in `scope` (wherever they live) to `state`:
/// a resumed run's scaler carries on where the saved one stopped.
void write_scaler_state(Scope& scope, const LossScalerState& state);

}  // namespace mix::amp
