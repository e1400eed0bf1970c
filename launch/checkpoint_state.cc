#include "launch/checkpoint_state.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "amp/loss_scaler.h"
#include "launch/cli_checks.h"
#include "launch/worker_main.h"
#include "runtime/core/check.h"
#include "runtime/core/log.h"

namespace mix::launch {

namespace {

// A whole count (the step, a scaler counter) from --resume's metadata; 0 when
// the checkpoint has none (resume_from_checkpoint requires the step). A value that is not one names the file and the field.
int64_t metadata_count(const std::string& path, const io::Metadata& meta, const char* key) {
  const auto it = meta.find(key);
  if (it == meta.end()) return 0;
  double v = 0;  // exact for any count below 2^53
  if (parse_number(it->second, /*integer=*/true, v) && v >= 0) return static_cast<int64_t>(v);
  MIX_FAIL("--resume " << path << ": metadata field '" << key << "' is '" << it->second
                       << "', not a whole number >= 0; the checkpoint is corrupt or was not written by mixtrain");
}

// The loss scale from --resume's metadata: a finite FP32 value above 0.
float metadata_loss_scale(const std::string& path, const io::Metadata& meta) {
  const std::string& text = meta.at("loss_scale");
  double v = 0;
  // Compared as the float it becomes: the 9 digits save_checkpoint writes
  // for FP32's largest value (3.40282347e+38) are a little above FLT_MAX as a double.
  if (parse_number(text, /*integer=*/false, v) && v > 0 && std::isfinite(static_cast<float>(v)))
    return static_cast<float>(v);
  MIX_FAIL("--resume " << path << ": metadata field 'loss_scale' is '" << text
                       << "', not a finite number above 0; the checkpoint is corrupt or was not written by mixtrain");
}

// The scaler's counters in a checkpoint's metadata: written and read back by one table.
constexpr std::pair<const char*, int64_t amp::LossScalerState::*> kScalerCounts[] = {
    {"scaler_good_steps", &amp::LossScalerState::good_steps},
    {"scaler_bad_steps", &amp::LossScalerState::bad_steps},
    {"scaler_skipped_steps", &amp::LossScalerState::skipped_steps},
    {"scaler_consecutive_skips_at_min", &amp::LossScalerState::consecutive_skips_at_min}};

// How a user gives resume setting `key` = `value`, for messages.
std::string setting_text(const std::string& key, const std::string& value) {
  if (key == "world_size") return value + " rank(s)";
  if (key == "training_examples") return "a training set of " + value + " examples";
  std::string flag = "--" + key;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag + " " + value;
}

// --resume continues the run that wrote the checkpoint from where it
// stopped: a run that differs in a resume setting would silently repeat and
// skip examples, or drop optimizer state, so it is refused, naming the
// setting. A checkpoint of step 0 (`--steps 0 --save`) has no place in the
// data yet (its optimizer slots, zeros, are checked by the load itself); a
// setting the checkpoint lacks (written before mixtrain saved it) is not
// compared.
void check_resume_continues(const std::string& path, const io::Metadata& meta, int64_t step, const TrainConfig& c,
                            int world, int64_t training_examples) {
  if (step == 0) return;
  for (const auto& [key, here] : resume_settings(c, world, training_examples)) {
    const auto it = meta.find(key);
    // Checkpoints from before accumulation existed were written with one micro-batch a step.
    const std::string there = it != meta.end() ? it->second : key == "grad_accum_steps" ? "1" : here;
    if (there == here) continue;
    throw UsageError("--resume " + path + " was written at step " + std::to_string(step) + " by a run with " +
                     setting_text(key, there) + ", and this run has " + setting_text(key, here) +
                     ": it would not continue that run (the data order, the place in it, or the optimizer state "
                     "would differ). Resume with " +
                     setting_text(key, there) + ", or start a new run from its parameters with --init-from");
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> resume_settings(const TrainConfig& c, int world,
                                                                 int64_t training_examples) {
  return {{"seed", std::to_string(c.seed)},
          {"shuffle", c.shuffle ? "true" : "false"},
          {"training_examples", std::to_string(training_examples)},
          {"batch_size", std::to_string(c.batch_size)},
          {"grad_accum_steps", std::to_string(c.grad_accum_steps)},
          {"world_size", std::to_string(world)},
          {"optimizer", std::string(optim::to_string(c.optimizer.kind))}};
}

std::string loss_scale_text(float scale) {
  std::ostringstream s;
  s.precision(9);
  s << scale;
  return s.str();
}

io::Metadata checkpoint_metadata(const TrainConfig& c, int world, int64_t training_examples, int64_t steps_done,
                                 int64_t steps_per_epoch, const Scope& scope, bool amp) {
  io::Metadata meta = {{"step", std::to_string(steps_done)},
                       {"model", c.model},
                       {"epoch", std::to_string(steps_done / steps_per_epoch)},
                       {"batch_in_epoch", std::to_string(steps_done % steps_per_epoch * c.grad_accum_steps)}};
  for (auto& [key, value] : resume_settings(c, world, training_examples)) meta[key] = value;
  if (amp) {
    const amp::LossScalerState s = amp::read_scaler_state(scope);
    meta["loss_scale"] = loss_scale_text(s.scale);
    for (const auto& [key, count] : kScalerCounts) meta[key] = std::to_string(s.*count);
  }
  return meta;
}

int64_t resume_from_checkpoint(const std::string& path, const TrainConfig& c, const Program& program, Scope& scope,
                               int world, int64_t training_examples, bool amp, bool log) {
  const io::Metadata meta = io::load_checkpoint(path, program, scope, [&](const io::Metadata& m) {
    // Without its step a file cannot say where the run stopped: resumed "at
    // step 0" it would repeat the schedule with the optimizer state of a
    // later step. What a plain safetensors.save_file writes has none.
    if (!m.count("step"))
      throw UsageError("--resume " + path + " has no 'step' in its metadata, so it cannot say where its run "
                       "stopped: it was not written by mixtrain's --save (a plain safetensors file has no such "
                       "field). To start a new run from its parameters, use --init-from " + path +
                       " (which leaves its optimizer state aside)");
    check_resume_continues(path, m, metadata_count(path, m, "step"), c, world, training_examples);
  });
  const int64_t step = metadata_count(path, meta, "step");
  if (amp) {
    // A checkpoint without the scaler's state (--steps 0 --save, or FP32
    // training) starts the scaler afresh, as a new run would.
    const bool has_scaler = meta.count("loss_scale") > 0;
    amp::LossScalerState s;
    s.scale = has_scaler ? metadata_loss_scale(path, meta) : c.loss_scaler_config().init_loss_scaling;
    for (const auto& [key, count] : kScalerCounts) s.*count = metadata_count(path, meta, key);
    amp::write_scaler_state(scope, s);
    if (log && !has_scaler)
      spdlog::info(
          "{} holds no loss-scaler state (saved before training or by FP32 training): the scaler "
          "starts at {}",
          path, s.scale);
  }
  if (log) spdlog::info("resumed from {} at step {}", path, step);
  return step;
}

}  // namespace mix::launch
