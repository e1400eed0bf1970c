// launch/outlier_detector.cc: no z-score until 128 values; then (x - mean) / SD
// of the last 128, x joining the window after; non-finite values are neither
// judged nor remembered. Whole runs: e2e.test_outlier_skip.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "launch/outlier_detector.h"

using mix::launch::kOutlierWindow;
using mix::launch::OutlierDetector;

TEST_CASE("the outlier detector judges a value against the last 128", "[outlier]") {
  OutlierDetector d;
  // 0, 1, 0, 1, ...: mean 0.5, SD 0.5.
  for (size_t i = 0; i < kOutlierWindow; ++i) CHECK(std::isnan(d.observe(static_cast<double>(i % 2))));
  CHECK(d.observe(2.0) == 3.0);  // (2 - 0.5) / 0.5; 2 replaces the oldest 0
  CHECK(std::isnan(d.observe(std::numeric_limits<double>::quiet_NaN())));
  CHECK(std::isnan(d.observe(std::numeric_limits<double>::infinity())));
  // Window now: 1, 0, 1, ..., 0, 1 (127 values) and 2: its mean and SD.
  double mean = 0, var = 0;
  const int ones = 64, zeros = 63;
  mean = (ones * 1.0 + 2.0) / 128;
  var = (ones * (1 - mean) * (1 - mean) + zeros * mean * mean + (2 - mean) * (2 - mean)) / 128;
  CHECK(d.observe(1.0) == Approx((1.0 - mean) / std::sqrt(var)).epsilon(1e-12));
}

TEST_CASE("a window of equal values makes any larger value an outlier, and an equal one not", "[outlier]") {
  OutlierDetector d;
  for (size_t i = 0; i < kOutlierWindow; ++i) d.observe(1.0);
  CHECK(d.observe(1.0) == 0.0);
  CHECK(std::isinf(d.observe(1.5)));
}
