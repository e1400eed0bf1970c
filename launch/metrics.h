#pragma once
// The metrics file: JSON Lines, one object per step, evaluation lines, and a
// closing summary line. Written by rank 0 only; flushed every line so a crash
// keeps what was measured.
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace mix::launch {

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
