#include "runtime/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace mix::optim {

namespace {
constexpr double kPi = 3.14159265358979323846;
double cosine_between(double from, double to, double frac) {
  return to + (from - to) * 0.5 * (1.0 + std::cos(kPi * std::clamp(frac, 0.0, 1.0)));
}
}  // namespace

double LrSchedule::at(int64_t step) const {
  const int64_t total = std::max<int64_t>(total_steps, 1);
  if (kind == Schedule::onecycle) {
    // torch's phases: up to the peak at step pct_start * total - 1 (not
    // rounded), then down to the last step, total - 1.
    const double at_peak =
        (warmup_steps > 0 ? static_cast<double>(warmup_steps) : 0.3 * static_cast<double>(total)) - 1.0;
    const double initial = peak / 25.0, final_lr = initial / 1e4, s = static_cast<double>(step);
    if (s <= at_peak) return at_peak > 0 ? cosine_between(initial, peak, s / at_peak) : peak;
    return cosine_between(peak, final_lr, (s - at_peak) / std::max(static_cast<double>(total - 1) - at_peak, 1e-9));
  }
  if (step < warmup_steps) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == Schedule::cosine) {
    const int64_t rest = std::max<int64_t>(1, total - warmup_steps);
    return cosine_between(peak, 0.0, static_cast<double>(step - warmup_steps) / static_cast<double>(rest));
  }
  return peak;
}

}  // namespace mix::optim
