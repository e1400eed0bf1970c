#pragma once
// The dynamic loss scaler (docs/design.md, "The loss scaler"): Paddle's parameters and
// semantics, with PyTorch GradScaler's as a preset.
//
// The scale multiplies the loss gradient so that small FP16 gradients do not
// flush to zero; check_finite_and_unscale divides it out of the FP32 master
// gradients and raises found_inf; every rank then feeds the same (all-reduced)
// flag to update_loss_scaling, so every rank keeps the same scale and skips the
// same steps. update_loss_scaling() below is that update on the host; the
// update_loss_scaling op runs the same arithmetic (amp/loss_scaling_math.h).
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "amp/loss_scaling_math.h"
#include "runtime/core/enum_names.h"
#include "runtime/ir/program.h"

namespace mix {
class Scope;
}

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

struct LossScalerConfig {
  /// dynamic: Paddle's update; static_scale: a fixed scale (init_loss_scaling);
  /// none: scale 1 (no scaling). In every mode an overflowed step is skipped.
  enum class Mode { dynamic, static_scale, none };
  /// What happens once max_skips_at_min consecutive steps overflowed with the
  /// scale already at min_loss_scaling (any scale under static and none, which
  /// never goes lower): stop with an error, or keep skipping.
  enum class OnMinScale { error, continue_ };

  Mode mode = Mode::dynamic;
  float init_loss_scaling = 32768.f;
  int incr_every_n_steps = 1000;
  int decr_every_n_nan_or_inf = 2;
  float incr_ratio = 2.f;
  float decr_ratio = 0.8f;
  float min_loss_scaling = 1.f;
  OnMinScale on_min_scale = OnMinScale::error;
  int max_skips_at_min = 100;  // consecutive skipped steps at the minimum before on_min_scale applies
};

/// The --loss-scaling values and the op's "mode" attr.
inline constexpr NamedValue<LossScalerConfig::Mode> kLossScalingNames[] = {
    {LossScalerConfig::Mode::dynamic, "dynamic"},
    {LossScalerConfig::Mode::static_scale, "static"},
    {LossScalerConfig::Mode::none, "none"}};
/// The --on-min-scale values and the op's "on_min_scale" attr.
inline constexpr NamedValue<LossScalerConfig::OnMinScale> kOnMinScaleNames[] = {
    {LossScalerConfig::OnMinScale::error, "error"}, {LossScalerConfig::OnMinScale::continue_, "continue"}};

/// The dynamic scaler's defaults (--loss-scaling-preset): paddle (the
/// defaults above) or pytorch (init 65536, x2 every 2000 good steps, x0.5 on
/// every overflow: torch.cuda.amp.GradScaler's).
enum class ScalerPreset { paddle, pytorch };
inline constexpr NamedValue<ScalerPreset> kScalerPresetNames[] = {{ScalerPreset::paddle, "paddle"},
                                                                   {ScalerPreset::pytorch, "pytorch"}};

/// The scaler of `mode`: dynamic with `dynamic_preset`'s defaults; static
/// (the scale stays init_loss_scaling); none (scale 1; an overflowed step is
/// still skipped).
LossScalerConfig scaler_config(LossScalerConfig::Mode mode, ScalerPreset dynamic_preset = ScalerPreset::paddle);

/// scaler_config by one name: "paddle", "pytorch" (dynamic with that preset),
/// "static" or "none". Any other name throws mix::Error listing these.
LossScalerConfig preset(std::string_view name);

/// "dynamic" | "static" | "none", and back (throws mix::Error on another name).
std::string_view mode_name(LossScalerConfig::Mode m);
LossScalerConfig::Mode parse_mode(std::string_view name);
/// "error" | "continue", and back (throws mix::Error on another name).
std::string_view on_min_scale_name(LossScalerConfig::OnMinScale o);
LossScalerConfig::OnMinScale parse_on_min_scale(std::string_view name);

/// Throws mix::Error naming the first field out of range: init_loss_scaling
/// positive and finite; in dynamic mode also intervals >= 1, incr_ratio >= 1,
/// 0 < decr_ratio <= 1 and 0 < min_loss_scaling <= init_loss_scaling.
void validate(const LossScalerConfig& c);

/// The state a run starts from: scale = init_loss_scaling (1 in mode none), counters 0.
LossScalerState initial_state(const LossScalerConfig& c);

/// The plain-field parameters the MIX_HD update takes.
LossScalingParams to_params(const LossScalerConfig& c);

/// One step of the scaler (docs/design.md, "The loss scaler"), updating `s` in place.
/// When max_skips_at_min consecutive overflow steps have been taken at the
/// minimum scale and on_min_scale is error, throws mix::Error (after updating
/// `s`) that says what to try.
void update_loss_scaling(const LossScalerConfig& c, LossScalerState& s, bool found_inf);

/// The check that ends update_loss_scaling: throws its "stuck at the minimum"
/// error when `s` (a state after a step) is stuck and on_min_scale is error.
void check_not_stuck(const LossScalerConfig& c, const LossScalerState& s);

/// The update_loss_scaling op's attributes for a config, and back.
/// Attribute names are the config's field names; mode and on_min_scale are strings.
std::map<std::string, Attr> to_op_attrs(const LossScalerConfig& c);
/// Missing attributes take the paddle defaults; a mistyped one throws mix::Error naming it.
/// (init_loss_scaling is not an attribute: the op reads the scale from its input.)
LossScalerConfig from_op_attrs(const OpDesc& op);

/// After a step of `program` (every update_loss_scaling op in it): throws the
/// stuck error from the state the op left in `scope`. The CPU op throws it
/// itself; the CUDA op leaves it to the host after the step, since reading a
/// flag mid-step would stall the GPU (amp/cuda/amp_ops.cu). Reads one scalar
/// per op unless the scale is stuck.
void check_loss_scale_not_stuck(const Program& program, const Scope& scope);

/// Declares the scaler's persistable state in `p`, initialised from `config`.
void declare_scaler_state(Program& p, const LossScalerConfig& config);

/// Step 7 of the AMP step: appends the update_loss_scaling op, which reads the
/// global found_inf and updates the scale and its counters (the same on every
/// rank, since the flag is). Checks the config first (validate()).
void append_update_loss_scaling(Program& p, const LossScalerConfig& config);

/// The scaler's state as its variables in `scope` hold it (on the host or a
/// device): what a checkpoint saves and the ranks' consistency check compares.
LossScalerState read_scaler_state(const Scope& scope);

/// Sets the scaler's variables in `scope` (wherever they live) to `state`:
/// a resumed run's scaler carries on where the saved one stopped.
void write_scaler_state(Scope& scope, const LossScalerState& state);

/// A config and the state it drives (the host-side scaler of the trainer and tests).
class LossScaler {
 public:
  explicit LossScaler(LossScalerConfig config = {});
  /// Resumes from a saved state (checkpoints).
  LossScaler(LossScalerConfig config, LossScalerState state);

  /// Records one step; throws as update_loss_scaling() does.
  void update(bool found_inf) { update_loss_scaling(config_, state_, found_inf); }
  float scale() const { return state_.scale; }
  const LossScalerState& state() const { return state_; }
  void set_state(const LossScalerState& s) { state_ = s; }
  const LossScalerConfig& config() const { return config_; }

 private:
  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace mix::amp
