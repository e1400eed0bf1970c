// launch/metrics.h: the benchmark's verdict on what sets a GPU step's pace,
// which gpu_check readers take at its word, the summary's totals, and the
// metrics file's lines.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>

#include "launch/metrics.h"
#include "temp_files.h"

using namespace mix::launch;

TEST_CASE("pace_verdict names the host only when it queues for most of the step", "[metrics]") {
  // Figures of the kind the GPU check measured (docs/gpu.md): ResNet-50 AMP at
  // batch 64 (host-bound) and FP32 (the GPU's backlog: the host was done after
  // 46% of the step).
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

TEST_CASE("StepTotals: the mean of the step rates, and the throughput, which differ", "[metrics]") {
  StepTotals t;
  CHECK(t.mean_rate() == 0);  // no timed step: zeros, not NaN
  CHECK(t.overall_rate() == 0);
  CHECK(t.step_ms() == 0);
  CHECK(t.host_queue_ms() == 0);
  // One slow step (a recording, a first cuDNN choice) and three fast ones of
  // 64 examples: 64 / 1 s, then 64 / 0.01 s three times.
  t.add_timed(1.0, 0.9, 64, 64.0);
  for (int i = 0; i < 3; ++i) t.add_timed(0.01, 0.004, 64, 6400.0);
  CHECK(t.steps == 4);
  CHECK(t.samples == 256);
  CHECK(t.mean_rate() == Approx((64.0 + 3 * 6400.0) / 4));  // 4816 samples/s
  CHECK(t.overall_rate() == Approx(256 / 1.03));            // about 248.5: what the run delivered
  CHECK(t.step_ms() == Approx(1e3 * 1.03 / 4));
  CHECK(t.host_queue_ms() == Approx(1e3 * 0.912 / 4));
  CHECK(t.skipped == 0);  // add_timed counts no overflow: the trainer counts those, timed or not
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
