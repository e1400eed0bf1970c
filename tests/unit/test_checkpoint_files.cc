// A checkpoint's files: the completion marker (a cut-short or changed file is
// not complete), the --keep-checkpoints history, --resume auto's choice, and
// the checks that keep a diverged run's state out of a checkpoint.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <limits>

#include "runtime/core/check.h"
#include "runtime/io/checkpoint.h"
#include "runtime/io/checkpoint_files.h"
#include "runtime/io/safetensors.h"
#include "tests/unit/temp_files.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using namespace mix;
using namespace mix::test;

namespace {

// A model of one parameter and one optimizer slot, as the optimizers declare them.
Program tiny_program() {
  Program p;
  VarDesc w;
  w.name = "fc.weight";
  w.shape = {2, 2};
  w.persistable = w.is_parameter = true;
  p.add_var(w);
  VarDesc v = w;
  v.name = "optimizer.momentum_buffer.fc.weight";
  v.is_parameter = false;
  p.add_var(v);
  return p;
}

Scope tiny_scope(float w, float v) {
  Scope s;
  s.set("fc.weight", Tensor::from_floats({2, 2}, {w, w, w, w}));
  s.set("optimizer.momentum_buffer.fc.weight", Tensor::from_floats({2, 2}, {v, v, v, v}));
  return s;
}

// What --save does for a checkpoint of `step`.
void save(const std::string& path, const Program& p, const Scope& s, int64_t step, int64_t keep) {
  io::save_checkpoint_keeping(path, p, s, {{"step", std::to_string(step)}}, step, keep);
}

}  // namespace

TEST_CASE("a checkpoint with its marker is complete; cut short or changed, it is not", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const Program p = tiny_program();
  save(path, p, tiny_scope(1, 0), 7, 1);
  std::string why;
  REQUIRE(io::complete_step(path, &why) == 7);

  // One flipped byte keeps the size: only the CRC-32 can tell.
  std::string bytes = read_bytes(path);
  bytes[bytes.size() - 1] ^= 1;
  write_bytes(path, bytes);
  CHECK_FALSE(io::complete_step(path, &why));
  CHECK_THAT(why, Contains("CRC-32"));

  write_bytes(path, bytes.substr(0, bytes.size() - 4));
  CHECK_FALSE(io::complete_step(path, &why));

  fs::remove(io::completion_marker_path(path));
  CHECK_FALSE(io::complete_step(path, &why));
  CHECK_THAT(why, Contains("no completion marker"));
}

TEST_CASE("--keep-checkpoints N keeps the newest N, and --resume auto takes the newest complete one",
          "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const Program p = tiny_program();
  std::vector<std::string> skipped;
  CHECK_FALSE(io::newest_complete_checkpoint(path, &skipped));  // nothing yet: a fresh start

  for (int64_t step : {10, 20, 30, 40}) save(path, p, tiny_scope(static_cast<float>(step), 0), step, 3);
  std::vector<io::CheckpointFile> history = io::checkpoint_history(path);
  REQUIRE(history.size() == 2);  // with m.safetensors, 3 in all
  CHECK(history[0].step == 20);
  CHECK(history[1].step == 30);
  CHECK(io::complete_step(history[0].path) == 20);
  CHECK(io::complete_step(history[1].path) == 30);
  CHECK_FALSE(fs::exists(dir.file("m.step10.safetensors")));
  CHECK_FALSE(fs::exists(dir.file("m.step10.safetensors.complete")));
  // The kept file holds that step's values, not the newest ones (a link made
  // before the rename keeps the old bytes).
  const io::SafetensorsFile kept = io::read_safetensors(history[1].path);
  CHECK(kept.find("fc.weight")->data<float>()[0] == 30.f);

  auto newest = io::newest_complete_checkpoint(path, &skipped);
  REQUIRE(newest);
  CHECK(newest->path == path);
  CHECK(newest->step == 40);

  // The newest file cut short (a save interrupted on a file system whose
  // rename is not atomic): the one before it is taken, and the skip is said.
  const std::string bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() / 2));
  skipped.clear();
  newest = io::newest_complete_checkpoint(path, &skipped);
  REQUIRE(newest);
  CHECK(newest->step == 30);
  REQUIRE(skipped.size() == 1);
  CHECK_THAT(skipped[0], Contains(path));
}

TEST_CASE("keeping one checkpoint leaves no history", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const Program p = tiny_program();
  for (int64_t step : {1, 2, 3}) save(path, p, tiny_scope(1, 0), step, 1);
  CHECK(io::checkpoint_history(path).empty());
  CHECK(io::complete_step(path) == 3);
}

TEST_CASE("non-finite optimizer state is refused on load, and never replaces a good checkpoint", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const Program p = tiny_program();
  save(path, p, tiny_scope(1, 0.5f), 5, 1);
  const std::string good = read_bytes(path);

  const float inf = std::numeric_limits<float>::infinity();
  Scope diverged = tiny_scope(1, inf);
  CHECK_THROWS_WITH(io::save_checkpoint(path, p, diverged, {{"step", "6"}}),
                    Contains("optimizer.momentum_buffer.fc.weight") && Contains("inf") &&
                        Contains("not saving") && Contains("step 6"));
  CHECK(read_bytes(path) == good);
  CHECK(io::complete_step(path) == 5);
  Scope nan_param = tiny_scope(std::nanf(""), 0);
  CHECK_THROWS_WITH(io::save_checkpoint(path, p, nan_param, {{"step", "6"}}), Contains("fc.weight"));
  CHECK(read_bytes(path) == good);

  // A file written by another program with inf in the optimizer state.
  io::write_safetensors(path,
                    {{"fc.weight", Tensor::from_floats({2, 2}, {1, 1, 1, 1})},
                     {"optimizer.momentum_buffer.fc.weight", Tensor::from_floats({2, 2}, {0, inf, 0, 0})}},
                    {{"step", "5"}});
  Scope loaded = tiny_scope(0, 0);
  CHECK_THROWS_WITH(io::load_checkpoint(path, p, loaded),
                    Contains("optimizer state 'optimizer.momentum_buffer.fc.weight' holds inf at element 1"));
}
