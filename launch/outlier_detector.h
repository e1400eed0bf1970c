#pragma once
// Outlier skips (--skip-loss-zscore Z, --skip-grad-norm-zscore Z): an update
// whose loss or gradient norm lies more than Z standard deviations above the
// mean of the last kOutlierWindow steps is skipped, as llm.c's outlier
// detector does. Both values are the same on every rank (the loss averaged
// over ranks, the norm of the all-reduced gradients), so every rank decides
// alike. No decision until the window is full; a non-finite value (an
// overflowed step's) is neither judged nor remembered.
#include <cstddef>
#include <vector>

namespace mix::launch {

inline constexpr size_t kOutlierWindow = 128;

class OutlierDetector {
 public:
  /// The z-score of `x` against the window (NaN while the window is not full,
  /// or for a non-finite x), then `x` joins the window.
  double observe(double x);

 private:
  std::vector<double> window_;  // a ring once full
  size_t next_ = 0;
};

}  // namespace mix::launch
