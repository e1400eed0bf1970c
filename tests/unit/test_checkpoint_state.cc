// The loss scaler's state through a checkpoint (launch/checkpoint_state.h):
// checkpoint_metadata writes every field, save_checkpoint stores it,
// resume_from_checkpoint puts every field back. A field that is not written,
// or not restored, comes back as a new run's value, which no saved value
// below equals.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "amp/loss_scaler.h"
#include "launch/checkpoint_state.h"
#include "runtime/io/checkpoint.h"
#include "tests/unit/temp_files.h"

using namespace mix;

namespace {

using amp::ScalerVars;
using test::TempDir;

// One parameter and the scaler's variables, as a training program declares them.
Program scaler_program(const launch::TrainConfig& c) {
  Program p;
  VarDesc w;
  w.name = "fc.weight";
  w.shape = {2};
  w.dtype = DType::f32;
  w.persistable = w.is_parameter = true;
  p.add_var(w);
  amp::declare_scaler_state(p, c.loss_scaler_config());
  return p;
}

// A scope as a new run starts it: the parameter, and the scaler at its
// initial scale with zero counts.
Scope fresh_scope(const launch::TrainConfig& c, float weight) {
  Scope s;
  s.set("fc.weight", Tensor::from_floats({2}, {weight, weight}));
  s.set(ScalerVars::scale, Tensor::from_floats({1}, {c.loss_scaler_config().init_loss_scaling}));
  for (const char* name : {ScalerVars::good_steps, ScalerVars::bad_steps, ScalerVars::skipped, ScalerVars::skips_at_min}) {
    Tensor t = Tensor::empty({1}, DType::i64);
    t.data<int64_t>()[0] = 0;
    s.set(name, t);
  }
  return s;
}

}  // namespace

TEST_CASE("the loss scaler's state survives a checkpoint, every field", "[checkpoint][scaler]") {
  launch::TrainConfig c;
  const Program p = scaler_program(c);
  const int world = 2;
  const int64_t examples = 640, steps_done = 40, steps_per_epoch = 10;

  // Every field differs from a new run's value and from every other field,
  // and the scale needs all 9 digits to read back as the same float.
  amp::LossScalerState saved;
  saved.scale = 1234.56789f;
  saved.good_steps = 17;
  saved.bad_steps = 3;
  saved.skipped_steps = 29;
  saved.consecutive_skips_at_min = 2;
  REQUIRE(saved.scale != c.loss_scaler_config().init_loss_scaling);
  Scope scope = fresh_scope(c, 0.5f);
  amp::write_scaler_state(scope, saved);

  const io::Metadata meta = launch::checkpoint_metadata(c, world, examples, steps_done, steps_per_epoch, scope, true);
  // Each field is in the metadata, with the value saved (text as written for a count).
  const std::pair<const char*, std::string> counts[] = {{"scaler_good_steps", "17"},
                                                        {"scaler_bad_steps", "3"},
                                                        {"scaler_skipped_steps", "29"},
                                                        {"scaler_consecutive_skips_at_min", "2"}};
  for (const auto& [key, text] : counts) {
    INFO(key);
    REQUIRE(meta.count(key) == 1);
    CHECK(meta.at(key) == text);
  }
  REQUIRE(meta.count("loss_scale") == 1);
  CHECK(std::strtof(meta.at("loss_scale").c_str(), nullptr) == saved.scale);
  CHECK(meta.at("step") == "40");

  TempDir dir;
  const std::string path = dir.file("scaler.safetensors");
  io::save_checkpoint(path, p, scope, meta);

  SECTION("resumed: every field as saved") {
    Scope resumed = fresh_scope(c, 9.0f);
    CHECK(launch::resume_from_checkpoint(path, c, p, resumed, world, examples, true, false) == steps_done);
    const amp::LossScalerState got = amp::read_scaler_state(resumed);
    CHECK(got.scale == saved.scale);
    CHECK(got.good_steps == saved.good_steps);
    CHECK(got.bad_steps == saved.bad_steps);
    CHECK(got.skipped_steps == saved.skipped_steps);
    CHECK(got.consecutive_skips_at_min == saved.consecutive_skips_at_min);
    CHECK(resumed.get("fc.weight").to_floats() == std::vector<float>{0.5f, 0.5f});
  }
  SECTION("a scope holding another state is overwritten, not merged") {
    Scope resumed = fresh_scope(c, 9.0f);
    amp::LossScalerState other;
    other.scale = 8.0f;
    other.good_steps = other.bad_steps = other.skipped_steps = other.consecutive_skips_at_min = 1000;
    amp::write_scaler_state(resumed, other);
    launch::resume_from_checkpoint(path, c, p, resumed, world, examples, true, false);
    const amp::LossScalerState got = amp::read_scaler_state(resumed);
    CHECK(got.scale == saved.scale);
    CHECK(got.good_steps == saved.good_steps);
    CHECK(got.bad_steps == saved.bad_steps);
    CHECK(got.skipped_steps == saved.skipped_steps);
    CHECK(got.consecutive_skips_at_min == saved.consecutive_skips_at_min);
  }
}

TEST_CASE("a checkpoint without scaler state resumes with a new run's scaler", "[checkpoint][scaler]") {
  launch::TrainConfig c;
  const Program p = scaler_program(c);
  Scope scope = fresh_scope(c, 0.5f);
  // Saved without AMP (FP32 training): no scaler fields at all.
  const io::Metadata meta = launch::checkpoint_metadata(c, 1, 100, 5, 10, scope, false);
  for (const char* key :
       {"loss_scale", "scaler_good_steps", "scaler_bad_steps", "scaler_skipped_steps", "scaler_consecutive_skips_at_min"})
    CHECK(meta.count(key) == 0);
  TempDir dir;
  const std::string path = dir.file("fp32.safetensors");
  io::save_checkpoint(path, p, scope, meta);

  Scope resumed = fresh_scope(c, 9.0f);
  amp::LossScalerState other;
  other.scale = 8.0f;
  other.good_steps = other.bad_steps = other.skipped_steps = other.consecutive_skips_at_min = 1000;
  amp::write_scaler_state(resumed, other);
  CHECK(launch::resume_from_checkpoint(path, c, p, resumed, 1, 100, true, false) == 5);
  const amp::LossScalerState got = amp::read_scaler_state(resumed);
  CHECK(got.scale == c.loss_scaler_config().init_loss_scaling);
  CHECK(got.good_steps == 0);
  CHECK(got.bad_steps == 0);
  CHECK(got.skipped_steps == 0);
  CHECK(got.consecutive_skips_at_min == 0);
}
