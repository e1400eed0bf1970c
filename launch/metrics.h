#pragma once
// The metrics file: JSON Lines, one object per step, evaluation lines, and a
// closing summary line. Written by rank 0 only; flushed every line so a crash
// keeps what was measured.
#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace mix::launch {

/// What sets a GPU step's pace, from the host's mean time to queue a step and
/// the step's mean time: "the host ..." when the host is still queueing ops
/// in the last tenth of the step (the GPU then waits for it), else "the GPU
/// ...", with the two times as fractions. An empty string for a step time of 0.
std::string pace_verdict(double host_queue_ms, double step_ms);

/// The totals behind the summary line. Timed steps leave out a benchmark's
/// warm-up; every step, timed or not, counts towards `skipped`.
struct StepTotals {
  int64_t steps = 0;    // timed steps
  int64_t samples = 0;  // their examples, every rank's
  double seconds = 0;   // their time inside the training step (batch gathering excluded)
  /// The host's time to queue them. On a GPU, a step whose queueing takes
  /// nearly its whole time is bound by the host (launch and dispatch costs,
  /// or a hidden wait for the GPU), not by the GPU.
  double queue_seconds = 0;
  double rate_sum = 0;  // of each timed step's samples/s
  int64_t skipped = 0;        // steps skipped for an overflow
  int64_t outlier_skips = 0;  // updates skipped as outliers (--skip-loss-zscore, --skip-grad-norm-zscore)

  void add_timed(double step_seconds, double step_queue_seconds, int64_t step_samples, double samples_per_s);
  /// The summary's samples_per_s: the mean of the steps' rates.
  double mean_rate() const;
  /// The throughput: samples over the time inside the timed steps.
  double overall_rate() const;
  double step_ms() const;        // mean
  double host_queue_ms() const;  // mean
};

class MetricsWriter {
 public:
  /// An empty path writes nothing.
  explicit MetricsWriter(const std::string& path);
  void write(const nlohmann::json& line);
  bool enabled() const { return out_.is_open(); }

 private:
  std::ofstream out_;
};

}  // namespace mix::launch
