#pragma once
// The training program: one function turns a model's forward program into
// the whole data-parallel training step, as one ordered list of passes. The
// trainer, `mixbench grad-sync`, the example and the tests all build their
// programs here, so they all run the same step. train_program.cc reads as the
// step, each line naming the file that does its part.
//
// The one-line AMP switch: `options.precision = amp::Precision::amp;`
// (mixtrain's --precision amp; amp::Precision::bf16 for BF16). Everything
// else about AMP follows from it: the casts, the loss scale, the FP16
// gradient all-reduce, the unscale and the skipped steps.
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "amp/loss_scaler.h"
#include "amp/precision.h"
#include "amp/unscale_pass.h"
#include "collective/grad_allreduce_pass.h"
#include "runtime/core/dtype.h"
#include "runtime/ir/program.h"
#include "runtime/optim/optimizer.h"

namespace mix::launch {

/// The AMP part of the options, read under the mixed precisions (amp, bf16) only.
struct AmpSettings {
  /// Ops moved onto the white or black list (--amp-white-list, --amp-black-list).
  std::vector<std::string> custom_white, custom_black;
  amp::LossScalerConfig scaler = amp::preset("paddle");
  /// amp::fold_widening_casts and amp::fold_widening_grad_casts (--no-fold-casts: off).
  bool fold_casts = true;
  /// Testing aid: --inject-overflow.
  std::optional<amp::InjectOverflow> inject;
};

/// The whole-step rewrites after the optimizer: less memory traffic, the same
/// values (fuse_matmul_bias: the same in FP32, one rounding fewer in FP16 and
/// BF16). Each is on by default and has a flag that turns it off.
struct StepPasses {
  bool recompute_softmax = true;  // --store-softmax: off
  bool fuse_add_relu = true;      // --no-fuse-add-relu: off
  bool fuse_param_casts = true;   // AMP only; --no-fuse-param-casts: off
  bool fuse_bn_relu = true;       // --no-fuse-bn-relu: off
  bool fuse_matmul_bias = true;   // --no-fuse-matmul-bias: off
  bool fold_grad_sums = true;     // --no-fold-grad-sums: off
  bool fuse_add_layer_norm = true;  // --no-fuse-add-layer-norm: off
  /// World size 1 only (collective/elide_single_rank_sync.h); --no-elide-single-rank-sync: off.
  bool elide_single_rank_sync = true;
  /// Every pass off: the program as autodiff and the optimizer leave it.
  static StepPasses none() { return {false, false, false, false, false, false, false, false}; }
};

struct TrainProgramOptions {
  amp::Precision precision = amp::Precision::amp;
  AmpSettings amp;
  /// The dtype of the gradient all-reduce; unset: default_grad_reduce(precision).
  std::optional<collective::GradReduce> grad_reduce;
  /// The gradient all-reduce's world, buckets and overlap; unset: no
  /// data-parallel pass (the unscale then runs once, after backward).
  std::optional<collective::GradSyncOptions> grad_sync = collective::GradSyncOptions{};
  /// Micro-batches per optimizer step (--grad-accum-steps): each loss counts
  /// 1/K, the gradients are summed in FP32 and all-reduced once, during the
  /// last micro-batch's backward (collective/grad_accumulation_pass.h).
  int64_t grad_accum_steps = 1;
  /// torch.nn.utils.clip_grad_norm_ (--clip-grad-norm C) and clip_grad_value_
  /// (--clip-grad-value V) on the FP32 gradients, after the unscale; unset: off.
  /// The norm (grad_norm) is computed either way.
  std::optional<double> clip_grad_norm, clip_grad_value;
  /// Outlier skips (--skip-loss-zscore, --skip-grad-norm-zscore): the
  /// optimizer also skips when the host sets kOutlierSkip, which it decides
  /// between the two parts of the step (TrainProgram::update_from).
  bool outlier_skips = false;
  optim::OptimizerOptions optimizer;
  StepPasses passes;
  /// Variables the caller reads after a step besides the loss and the
  /// overflow flags (the logits, for evaluation): no pass fuses them away.
  std::set<std::string> read_back;
};

/// One pass of the pipeline as --print-program lists it.
struct PassRun {
  std::string name;    // "amp::rewrite"
  std::string file;    // "amp/rewrite.cc"
  bool ran = true;
  std::string off_by;  // why it did not run: the flag or setting that turned it off
  std::string result;  // what it did, when it says ("3 casts")
  /// For the whole-step rewrites (StepPasses), optional and the same values
  /// either way: the flag that turns the pass off. Empty for the others.
  std::string whole_step_flag;
  /// Whether the pass changed the program (a fusion that found nothing to fuse did not).
  bool changed = false;
};

struct TrainProgram {
  std::string loss;
  /// Autodiff's (parameter, gradient) pairs, before the all-reduce.
  optim::ParamGrads backward_grads;
  /// The (parameter, FP32 gradient) pairs the optimizer reads.
  optim::ParamGrads param_grads;
  /// The global overflow flag (i32 [1]); empty in FP32 training, where every step applies.
  std::string found_inf;
  /// The gradient buckets, in the order their all-reduces start (on one rank
  /// the buckets the data-parallel pass made, whose all-reduces pass 24 took out).
  std::vector<collective::GradBucket> buckets;
  /// What a step's caller may read back (the options' read_back, the loss
  /// and, under AMP, the flags): the executor's fetch list.
  std::set<std::string> read_back;
  /// Every pass of the pipeline, in order, run or not.
  std::vector<PassRun> passes;
  /// With grad_accum_steps K > 1: the program of the K - 1 micro-batches
  /// before the last of each step (forward, backward, gradients added to
  /// their accumulators); the step's own program runs the last.
  std::optional<Program> micro_batch_program;
  int64_t grad_accum_steps = 1;
  /// With outlier skips: the index of the step's first op of the update (its
  /// any_flag), which the caller runs after setting kOutlierSkip; 0: none.
  size_t update_from = 0;

  /// The ops [begin, end) of `step` as a program of their own (its variables all kept).
  static Program part(const Program& step, size_t begin, size_t end);

  /// "passes, in order:" and one line a pass, for --print-program.
  std::string describe_passes() const;
};

/// The host's outlier decision (i32 [1], fed each step; 1: skip the update),
/// and the flag the optimizer then reads.
inline constexpr const char* kOutlierSkip = "outlier_skip";
inline constexpr const char* kSkipUpdate = "skip_update";

/// The gradient all-reduce's dtype when none is given: FP16 under AMP (the
/// FP16 gradients, before their cast: half the bytes), FP32 otherwise.
collective::GradReduce default_grad_reduce(amp::Precision precision);

/// Why `reduce` cannot go with `precision` ("" when it can): FP32 training
/// has no FP16 gradients to reduce. The one place this rule is written:
/// mixtrain's and mixbench's flags and build_train_program all ask it.
std::string grad_reduce_conflict(amp::Precision precision, collective::GradReduce reduce);

/// Turns `program`, a forward program ending in the FP32 scalar `loss`, into
/// the training program `o` describes (train_program.cc lists the steps).
/// Throws UsageError when the options cannot make a valid program (an AMP
/// list that puts the loss in FP16, an FP16 reduction in FP32 training) and
/// mix::Error on a malformed program.
TrainProgram build_train_program(Program& program, const std::string& loss, const TrainProgramOptions& o);

}  // namespace mix::launch
