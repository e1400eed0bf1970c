#include "launch/outlier_detector.h"

#include <cmath>
#include <limits>

namespace mix::launch {

double OutlierDetector::observe(double x) {
  if (!std::isfinite(x)) return std::numeric_limits<double>::quiet_NaN();
  double z = std::numeric_limits<double>::quiet_NaN();
  if (window_.size() == kOutlierWindow) {
    double mean = 0;
    for (double v : window_) mean += v;
    mean /= static_cast<double>(window_.size());
    double var = 0;
    for (double v : window_) var += (v - mean) * (v - mean);
    const double sd = std::sqrt(var / static_cast<double>(window_.size()));
    z = sd > 0 ? (x - mean) / sd : (x > mean ? std::numeric_limits<double>::infinity() : 0.0);
    window_[next_] = x;
    next_ = (next_ + 1) % kOutlierWindow;
  } else {
    window_.push_back(x);
  }
  return z;
}

}  // namespace mix::launch
