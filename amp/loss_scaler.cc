#include "amp/loss_scaler.h"

#include <cmath>
#include <sstream>
#include <variant>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ir/scope.h"

namespace mix::amp {

using Mode = LossScalerConfig::Mode;
using OnMinScale = LossScalerConfig::OnMinScale;

LossScalerConfig scaler_config(Mode mode, ScalerPreset dynamic_preset) {
  LossScalerConfig c;  // the defaults are Paddle's
  c.mode = mode;
  if (mode == Mode::none) {
    c.init_loss_scaling = 1.f;
  } else if (mode == Mode::dynamic && dynamic_preset == ScalerPreset::pytorch) {
    // torch.cuda.amp.GradScaler: init_scale=2**16, growth_factor=2,
    // backoff_factor=0.5, growth_interval=2000; it backs off on every overflow.
    c.init_loss_scaling = 65536.f;
    c.incr_every_n_steps = 2000;
    c.incr_ratio = 2.f;
    c.decr_every_n_nan_or_inf = 1;
    c.decr_ratio = 0.5f;
  }
  return c;
}

LossScalerConfig preset(std::string_view name) {
  if (const auto p = value_named(name, kScalerPresetNames)) return scaler_config(Mode::dynamic, *p);
  if (name == "static" || name == "none") return scaler_config(parse_mode(name));
  MIX_FAIL("unknown loss-scaling preset '" << name << "': expected one of paddle, pytorch, static, none");
}

std::string_view mode_name(Mode m) { return name_of(m, kLossScalingNames); }

Mode parse_mode(std::string_view name) {
  if (const auto m = value_named(name, kLossScalingNames)) return *m;
  MIX_FAIL("unknown loss-scaling mode '" << name << "': expected " << names_of(kLossScalingNames));
}

std::string_view on_min_scale_name(OnMinScale o) { return name_of(o, kOnMinScaleNames); }

OnMinScale parse_on_min_scale(std::string_view name) {
  if (const auto o = value_named(name, kOnMinScaleNames)) return *o;
  MIX_FAIL("unknown on-min-scale policy '" << name << "': expected " << names_of(kOnMinScaleNames));
}

namespace {
bool positive_finite(float v) { return std::isfinite(v) && v > 0.f; }

// The fields the update reads (every step checks them: a bad interval or ratio
// would silently misbehave rather than fail).
void validate_update(const LossScalerConfig& c) {
  if (c.mode != Mode::dynamic) return;  // the other fields only drive the dynamic update
  MIX_CHECK(c.incr_every_n_steps >= 1, "incr_every_n_steps must be at least 1, got " << c.incr_every_n_steps);
  MIX_CHECK(c.decr_every_n_nan_or_inf >= 1,
            "decr_every_n_nan_or_inf must be at least 1, got " << c.decr_every_n_nan_or_inf);
  MIX_CHECK(std::isfinite(c.incr_ratio) && c.incr_ratio >= 1.f, "incr_ratio must be >= 1, got " << c.incr_ratio);
  MIX_CHECK(positive_finite(c.decr_ratio) && c.decr_ratio <= 1.f,
            "decr_ratio must be in (0, 1], got " << c.decr_ratio);
  MIX_CHECK(positive_finite(c.min_loss_scaling),
            "min_loss_scaling must be a positive finite number, got " << c.min_loss_scaling);
}
}  // namespace

void validate(const LossScalerConfig& c) {
  MIX_CHECK(positive_finite(c.init_loss_scaling),
            "init_loss_scaling must be a positive finite number, got " << c.init_loss_scaling);
  validate_update(c);
  MIX_CHECK(c.mode != Mode::dynamic || c.min_loss_scaling <= c.init_loss_scaling,
            "min_loss_scaling (" << c.min_loss_scaling << ") must not exceed init_loss_scaling ("
                                 << c.init_loss_scaling << ")");
}

LossScalerState initial_state(const LossScalerConfig& c) {
  LossScalerState s;
  s.scale = c.mode == Mode::none ? 1.f : c.init_loss_scaling;
  return s;
}

LossScalingParams to_params(const LossScalerConfig& c) {
  LossScalingParams p;
  p.dynamic = c.mode == Mode::dynamic;
  p.incr_every_n_steps = c.incr_every_n_steps;
  p.decr_every_n_nan_or_inf = c.decr_every_n_nan_or_inf;
  p.incr_ratio = c.incr_ratio;
  p.decr_ratio = c.decr_ratio;
  p.min_loss_scaling = c.min_loss_scaling;
  p.max_skips_at_min = c.max_skips_at_min;
  return p;
}

void update_loss_scaling(const LossScalerConfig& c, LossScalerState& s, bool found_inf) {
  validate_update(c);
  loss_scaling_step(to_params(c), s, found_inf);
  check_not_stuck(c, s);
}

void check_not_stuck(const LossScalerConfig& c, const LossScalerState& s) {
  if (!stuck_at_min(to_params(c), s) || c.on_min_scale != OnMinScale::error) return;
  std::ostringstream what;  // what went wrong, then what to try, by mode
  if (c.mode == Mode::dynamic) {
    what << "the loss scale is stuck at the minimum (min_loss_scaling " << c.min_loss_scaling << "): ";
  } else {
    what << "the loss scale is stuck: ";
  }
  what << s.consecutive_skips_at_min << " consecutive steps had inf/NaN gradients";
  if (c.mode == Mode::static_scale) what << " at the static loss scale " << s.scale;
  what << " and were skipped (" << s.skipped_steps << " skipped in all)";
  if (c.mode == Mode::static_scale) what << "; a static scale cannot go lower";
  if (c.mode == Mode::none) what << "; without loss scaling the FP16 values overflow unscaled";
  what << ". Training has diverged or the data has NaN/inf values. Try a lower --lr, check the data for NaN/inf, "
       << "pass --on-min-scale continue to keep skipping, ";
  // Only advice that can help: at a scale of 1 or less, --loss-scaling none
  // (scale 1) overflows just the same.
  if (c.mode == Mode::dynamic && c.min_loss_scaling > 1.f)
    what << "lower --min-loss-scaling or use --loss-scaling none, ";
  if (c.mode == Mode::static_scale)
    what << (s.scale > 1.f ? "use a lower --init-loss-scaling or --loss-scaling dynamic, "
                           : "use --loss-scaling dynamic, ");
  what << "or train in FP32 with --precision fp32";
  MIX_FAIL(what.str());
}

std::map<std::string, Attr> to_op_attrs(const LossScalerConfig& c) {
  return {
      {"mode", std::string(mode_name(c.mode))},
      {"incr_every_n_steps", int64_t{c.incr_every_n_steps}},
      {"decr_every_n_nan_or_inf", int64_t{c.decr_every_n_nan_or_inf}},
      {"incr_ratio", double{c.incr_ratio}},
      {"decr_ratio", double{c.decr_ratio}},
      {"min_loss_scaling", double{c.min_loss_scaling}},
      {"on_min_scale", std::string(on_min_scale_name(c.on_min_scale))},
      {"max_skips_at_min", int64_t{c.max_skips_at_min}},
  };
}

namespace {
template <typename T>
T attr_of(const OpDesc& op, const char* name, T fallback) {
  try {
    return op.attr<T>(name, fallback);
  } catch (const std::bad_variant_access&) {
    MIX_FAIL("op " << op.type << ": attribute '" << name << "' has the wrong type");
  }
}
}  // namespace

LossScalerConfig from_op_attrs(const OpDesc& op) {
  LossScalerConfig c;
  c.mode = parse_mode(attr_of<std::string>(op, "mode", "dynamic"));
  c.incr_every_n_steps = attr_of<int>(op, "incr_every_n_steps", c.incr_every_n_steps);
  c.decr_every_n_nan_or_inf = attr_of<int>(op, "decr_every_n_nan_or_inf", c.decr_every_n_nan_or_inf);
  c.incr_ratio = attr_of<float>(op, "incr_ratio", c.incr_ratio);
  c.decr_ratio = attr_of<float>(op, "decr_ratio", c.decr_ratio);
  c.min_loss_scaling = attr_of<float>(op, "min_loss_scaling", c.min_loss_scaling);
  c.on_min_scale = parse_on_min_scale(attr_of<std::string>(op, "on_min_scale", "error"));
  c.max_skips_at_min = attr_of<int>(op, "max_skips_at_min", c.max_skips_at_min);
  return c;
}

LossScaler::LossScaler(LossScalerConfig config) : LossScaler(config, initial_state(config)) {}

LossScaler::LossScaler(LossScalerConfig config, LossScalerState state) : config_(config), state_(state) {
  validate(config_);
}

void declare_scaler_state(Program& p, const LossScalerConfig& config) {
  const float init = config.mode == LossScalerConfig::Mode::none ? 1.f : config.init_loss_scaling;
  auto add = [&](const char* name, DType dt, double value) {
    VarDesc v{name, {1}, dt, true, false, true, {VarInit::Kind::constant, value}};
    p.add_var(v);
  };
  add(ScalerVars::scale, DType::f32, init);
  add(ScalerVars::good_steps, DType::i64, 0);
  add(ScalerVars::bad_steps, DType::i64, 0);
  add(ScalerVars::skipped, DType::i64, 0);
  add(ScalerVars::skips_at_min, DType::i64, 0);
  if (!p.has_var(ScalerVars::found_inf)) {
    VarDesc f{ScalerVars::found_inf, {1}, DType::i32, false, false, true, {}};
    p.add_var(f);
  }
}

void append_update_loss_scaling(Program& p, const LossScalerConfig& c) {
  validate(c);
  OpDesc update = make_op(
      "update_loss_scaling",
      {{"FoundInfinite", {ScalerVars::found_inf}},
       {"PrevLossScaling", {ScalerVars::scale}},
       {"InGoodSteps", {ScalerVars::good_steps}},
       {"InBadSteps", {ScalerVars::bad_steps}},
       {"Skipped", {ScalerVars::skipped}},
       {"ConsecutiveSkipsAtMin", {ScalerVars::skips_at_min}}},
      {{"LossScaling", {ScalerVars::scale}},
       {"OutGoodSteps", {ScalerVars::good_steps}},
       {"OutBadSteps", {ScalerVars::bad_steps}},
       {"OutSkipped", {ScalerVars::skipped}},
       {"OutConsecutiveSkipsAtMin", {ScalerVars::skips_at_min}}},
      to_op_attrs(c));
  update.role = OpRole::optimize;
  p.append_op(std::move(update));
}

namespace {

// A scaler variable, checked to be the one element of `dtype` declare_scaler_state made.
template <typename ScopeT>
auto& scaler_var(ScopeT& scope, const char* name, DType dtype) {
  auto& t = scope.get(name);
  MIX_CHECK(t.numel() == 1 && t.dtype() == dtype,
            "loss scaler variable '" << name << "' must be one " << dtype_name(dtype));
  return t;
}

// The one element of a scaler variable, on the host.
Tensor scaler_value(const Scope& scope, const char* name, DType dtype) {
  return scaler_var(scope, name, dtype).to(cpu_device());
}

// Sets the one element of a scaler variable, on the host or a device.
template <typename T>
void set_scaler_value(Scope& scope, const char* name, DType dtype, T value) {
  Tensor host = Tensor::empty({1}, dtype);
  host.data<T>()[0] = value;
  scaler_var(scope, name, dtype).copy_from(host);
}

}  // namespace

LossScalerState read_scaler_state(const Scope& scope) {
  LossScalerState s;
  s.scale = scaler_value(scope, ScalerVars::scale, DType::f32).data<float>()[0];
  s.good_steps = scaler_value(scope, ScalerVars::good_steps, DType::i64).data<int64_t>()[0];
  s.bad_steps = scaler_value(scope, ScalerVars::bad_steps, DType::i64).data<int64_t>()[0];
  s.skipped_steps = scaler_value(scope, ScalerVars::skipped, DType::i64).data<int64_t>()[0];
  s.consecutive_skips_at_min = scaler_value(scope, ScalerVars::skips_at_min, DType::i64).data<int64_t>()[0];
  return s;
}

void write_scaler_state(Scope& scope, const LossScalerState& state) {
  set_scaler_value(scope, ScalerVars::scale, DType::f32, state.scale);
  set_scaler_value(scope, ScalerVars::good_steps, DType::i64, state.good_steps);
  set_scaler_value(scope, ScalerVars::bad_steps, DType::i64, state.bad_steps);
  set_scaler_value(scope, ScalerVars::skipped, DType::i64, state.skipped_steps);
  set_scaler_value(scope, ScalerVars::skips_at_min, DType::i64, state.consecutive_skips_at_min);
}

}  // namespace mix::amp
