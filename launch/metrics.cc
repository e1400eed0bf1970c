#include "launch/metrics.h"

#include "runtime/core/check.h"

namespace mix::launch {

void StepTotals::add_timed(double step_seconds, double step_queue_seconds, int64_t step_samples, double samples_per_s) {
  ++steps;
  samples += step_samples;
  seconds += step_seconds;
  queue_seconds += step_queue_seconds;
  rate_sum += samples_per_s;
}

double StepTotals::mean_rate() const { return steps > 0 ? rate_sum / static_cast<double>(steps) : 0; }

double StepTotals::overall_rate() const { return seconds > 0 ? static_cast<double>(samples) / seconds : 0; }

double StepTotals::step_ms() const { return steps > 0 ? 1e3 * seconds / static_cast<double>(steps) : 0; }

double StepTotals::host_queue_ms() const { return steps > 0 ? 1e3 * queue_seconds / static_cast<double>(steps) : 0; }

std::string pace_verdict(double host_queue_ms, double step_ms) {
  if (!(step_ms > 0)) return {};
  // A host that queues for 90% of the step or more leaves the GPU idle for
  // part of it; below that, the GPU has a backlog at the step's end.
  const double share = host_queue_ms / step_ms;
  const int percent = static_cast<int>(share * 100 + 0.5);
  if (share >= 0.9)
    return "the host sets the pace: it queues ops for " + std::to_string(percent) +
           "% of the step, so the GPU waits for it (MIX_PROFILE_OPS=host shows where the host's time goes)";
  return "the GPU sets the pace: the host has queued the whole step " + std::to_string(percent) +
         "% of the way through it";
}

MetricsWriter::MetricsWriter(const std::string& path) {
  if (path.empty()) return;
  out_.open(path, std::ios::out | std::ios::trunc);
  if (!out_) MIX_FAIL("cannot write the metrics file " << path << " (does its directory exist?)");
}

void MetricsWriter::write(const nlohmann::json& line) {
  if (!out_.is_open()) return;
  out_ << line.dump() << '\n';
  out_.flush();
}

}  // namespace mix::launch
