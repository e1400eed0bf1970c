// launch/train_config.cc's flags that pick how a GPU runs convolutions: the
// graph API by default, its negation, and --cudnn-benchmark, which times the
// legacy calls' algorithms and so turns the graph API off (or is refused
// beside an explicit --cudnn-graph-conv, where one of the two would do nothing).
#include <catch2/catch.hpp>

#include <optional>
#include <string>
#include <vector>

#include "launch/train_config.h"

using namespace mix::launch;

namespace {

struct Parsed {
  std::optional<int> stop;  // the exit code when parsing says stop
  TrainConfig config;
};

Parsed parse(std::vector<std::string> flags) {
  flags.insert(flags.begin(), "mixtrain");
  std::vector<char*> argv;
  for (auto& f : flags) argv.push_back(f.data());
  Parsed p;
  p.stop = parse_train_config(static_cast<int>(argv.size()), argv.data(), p.config);
  return p;
}

}  // namespace

TEST_CASE("convolutions run on cuDNN's graph API unless asked otherwise", "[train_config]") {
  const Parsed defaults = parse({});
  REQUIRE_FALSE(defaults.stop);
  CHECK(defaults.config.cudnn_graph_conv);
  CHECK_FALSE(defaults.config.cudnn_benchmark);

  const Parsed off = parse({"--no-cudnn-graph-conv"});
  REQUIRE_FALSE(off.stop);
  CHECK_FALSE(off.config.cudnn_graph_conv);

  const Parsed on = parse({"--cudnn-graph-conv"});
  REQUIRE_FALSE(on.stop);
  CHECK(on.config.cudnn_graph_conv);
}

TEST_CASE("--cudnn-benchmark runs the legacy calls, whose algorithms it times", "[train_config]") {
  const Parsed bench = parse({"--cudnn-benchmark"});
  REQUIRE_FALSE(bench.stop);
  CHECK(bench.config.cudnn_benchmark);
  CHECK_FALSE(bench.config.cudnn_graph_conv);

  const Parsed both_off = parse({"--cudnn-benchmark", "--no-cudnn-graph-conv"});
  REQUIRE_FALSE(both_off.stop);
  CHECK(both_off.config.cudnn_benchmark);
  CHECK_FALSE(both_off.config.cudnn_graph_conv);

  // Both asked for: one of them would do nothing, so neither is guessed.
  const Parsed both = parse({"--cudnn-benchmark", "--cudnn-graph-conv"});
  REQUIRE(both.stop);
  CHECK(*both.stop == 2);
}
