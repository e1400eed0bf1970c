// launch/metrics.h: the benchmark's verdict on what sets a GPU step's pace,
// which gpu_check readers take at its word, and the metrics file's lines.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>

#include "launch/metrics.h"
#include "temp_files.h"

using namespace mix::launch;

TEST_CASE("pace_verdict names the host only when it queues for most of the step", "[metrics]") {
  // The H200 figures of 2026-12-04: ResNet-50 AMP at batch 64 (host-bound)
  // and FP32 (the GPU's backlog: the host was done after 46% of the step).
  const std::string amp = pace_verdict(39.70, 39.82);
  CHECK(amp.rfind("the host sets the pace", 0) == 0);
  CHECK(amp.find("100%") != std::string::npos);
  const std::string fp32 = pace_verdict(41.24, 88.94);
  CHECK(fp32.rfind("the GPU sets the pace", 0) == 0);
  CHECK(fp32.find("46%") != std::string::npos);
  // The boundary: 90% of the step is the host's.
  CHECK(pace_verdict(9.0, 10.0).rfind("the host", 0) == 0);
  CHECK(pace_verdict(8.9, 10.0).rfind("the GPU", 0) == 0);
  CHECK(pace_verdict(1.0, 0.0).empty());
}

TEST_CASE("MetricsWriter writes one JSON object a line, and nothing for an empty path", "[metrics]") {
  const mix::test::TempDir dir;
  const std::string path = dir.file("metrics_writer.jsonl");
  {
    MetricsWriter w(path);
    REQUIRE(w.enabled());
    w.write({{"step", 1}, {"loss", 2.5}});
    w.write({{"summary", true}});
  }
  std::ifstream in(path);
  std::string a, b, c;
  REQUIRE(std::getline(in, a));
  REQUIRE(std::getline(in, b));
  CHECK_FALSE(std::getline(in, c));
  CHECK(nlohmann::json::parse(a)["loss"].get<double>() == 2.5);
  CHECK(nlohmann::json::parse(b)["summary"].get<bool>());
  CHECK_FALSE(MetricsWriter("").enabled());
  CHECK_THROWS_WITH(MetricsWriter("/nonexistent-dir/m.jsonl"), Catch::Contains("does its directory exist"));
}
