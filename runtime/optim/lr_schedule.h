#pragma once
// Learning-rate schedules, evaluated on the host once per step.
#include <cstdint>
#include <string>

#include "runtime/core/enum_names.h"

namespace mix::optim {

enum class Schedule { constant, cosine, onecycle };

inline constexpr NamedValue<Schedule> kScheduleNames[] = {
    {Schedule::constant, "constant"}, {Schedule::cosine, "cosine"}, {Schedule::onecycle, "onecycle"}};

inline std::string_view to_string(Schedule s) { return name_of(s, kScheduleNames); }

struct LrSchedule {
  Schedule kind = Schedule::constant;
  double peak = 0.1;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  /// The rate for 0-based step `step`:
  ///  - a linear warm-up from peak/warmup to peak over warmup_steps (constant, cosine);
  ///  - constant: peak;  cosine: half a cosine from peak to 0 over the remaining steps;
  ///  - onecycle (torch OneCycleLR, pct_start 0.3 or warmup/total when a warm-up is
  ///    given): cosine from peak/25 up to peak at step pct_start * total - 1, then
  ///    cosine down to peak/(25 * 1e4) at the last step.
  double at(int64_t step) const;
};

}  // namespace mix::optim
