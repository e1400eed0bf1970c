#include "launch/metrics.h"

#include "runtime/check.h"

namespace mix::launch {

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
