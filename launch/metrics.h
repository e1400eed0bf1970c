#pragma once
// The metrics file: JSON Lines, one object per step, evaluation lines, and a
// closing summary line. Written by rank 0 only; flushed every line so a crash
// keeps what was measured.
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace mix::launch {

/// What sets a GPU step's pace, from the host's mean time to queue a step and
/// the step's mean time: "the host ..." when the host is still queueing ops
/// in the last tenth of the step (the GPU then waits for it), else "the GPU
/// ...", with the two times as fractions. An empty string for a step time of 0.
std::string pace_verdict(double host_queue_ms, double step_ms);

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
