#pragma once
// The arithmetic of one dynamic loss-scaling update, written once for host and
// device (MIX_HD): LossScaler::update, the CPU kernel of the update_loss_scaling
// op and its CUDA kernel (amp/cuda/amp_ops.cu: one thread reading the flag and
// the counters from device memory) all run loss_scaling_step, so every backend
// and every rank takes bit-identical decisions.
//
// Only plain fields and no exceptions here: the caller acts on the returned
// "stuck at the minimum" flag (the host throws or carries on, see loss_scaler.h).
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/kernels/functors.h"

namespace mix::amp {

/// The scaler's state; saved in checkpoints and compared across ranks.
struct LossScalerState {
  float scale = 1.f;
  int64_t good_steps = 0;   // consecutive finite steps since the last change (or overflow)
  int64_t bad_steps = 0;    // consecutive overflow steps since the last decrease (or finite step)
  int64_t skipped_steps = 0;  // every overflow step ever (the optimizer skipped it)
  int64_t consecutive_skips_at_min = 0;  // overflow steps taken at min_loss_scaling, reset by a finite step
};

/// The parameters of the update, as plain fields (a kernel argument).
struct LossScalingParams {
  bool dynamic = true;  // false for static and none: the scale never changes
  int64_t incr_every_n_steps = 1000;
  int64_t decr_every_n_nan_or_inf = 2;
  float incr_ratio = 2.f;
  float decr_ratio = 0.8f;
  float min_loss_scaling = 1.f;
  int64_t max_skips_at_min = 100;  // <= 0: never report "stuck"
};

/// One step of Paddle's update_loss_scaling (docs/design.md, "The loss scaler"):
///   finite:   bad = 0, good += 1; at incr_every_n_steps good steps the scale
///             grows by incr_ratio if the result is finite, and good = 0;
///   overflow: good = 0, bad += 1; at decr_every_n_nan_or_inf bad steps
///             scale = max(scale * decr_ratio, min_loss_scaling), and bad = 0.
/// Static and none modes leave scale, good and bad alone. Every overflow step
/// counts as skipped; one taken while the scale is already at (or below) the
/// minimum also counts towards consecutive_skips_at_min, and so does every one
/// under static and none, whose scale cannot go lower.
/// Whether a state is stuck at the minimum: consecutive_skips_at_min has
/// reached max_skips_at_min (never when that is <= 0).
MIX_HD bool stuck_at_min(const LossScalingParams& p, const LossScalerState& s) {
  return p.max_skips_at_min > 0 && s.consecutive_skips_at_min >= p.max_skips_at_min;
}

/// Returns stuck_at_min of the updated state.
MIX_HD bool loss_scaling_step(const LossScalingParams& p, LossScalerState& s, bool found_inf) {
  if (!found_inf) {
    s.consecutive_skips_at_min = 0;
    if (p.dynamic) {
      s.bad_steps = 0;
      s.good_steps += 1;
      // ">=" rather than "==": identical from a fresh state, and a state resumed
      // with a smaller interval still grows instead of never matching again.
      if (s.good_steps >= p.incr_every_n_steps) {
        const float grown = s.scale * p.incr_ratio;
        if (fn::is_finite(grown)) s.scale = grown;
        s.good_steps = 0;
      }
    }
    return false;
  }

  s.skipped_steps += 1;
  // "Already at the minimum" is judged before this step's decrease: the step
  // that lands on the minimum is not yet a step stuck there.
  if (!p.dynamic || !(s.scale > p.min_loss_scaling)) s.consecutive_skips_at_min += 1;
  if (p.dynamic) {
    s.good_steps = 0;
    s.bad_steps += 1;
    if (s.bad_steps >= p.decr_every_n_nan_or_inf) {
      const float shrunk = s.scale * p.decr_ratio;
      s.scale = shrunk > p.min_loss_scaling ? shrunk : p.min_loss_scaling;
      s.bad_steps = 0;
    }
  }
  return stuck_at_min(p, s);
}

}  // namespace mix::amp
