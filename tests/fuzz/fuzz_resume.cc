// --resume: a checkpoint's tensors and its metadata (the step, the settings a
// resumed run must share, the loss scaler's state), into a small program of
// a parameter, an optimizer slot and the scaler's state, as
// launch/checkpoint_state.h restores a training run. The seeds are
// checkpoints that mixtrain's own --save code writes (own_seeds below).
#include <cmath>

#include "amp/loss_scaler.h"
#include "launch/checkpoint_state.h"
#include "runtime/io/checkpoint.h"
#include "tests/fuzz/fuzz_files.h"
#include "tests/unit/temp_files.h"

namespace mix::fuzz {

const char* const kTargetName = "resume";

namespace {

constexpr int kWorld = 1;
constexpr int64_t kTrainingExamples = 640;

const launch::TrainConfig& config() {
  static const launch::TrainConfig c;  // AMP, as mixtrain's defaults are
  return c;
}

Program resume_program() {
  Program p;
  VarDesc w;
  w.name = "fc.weight";
  w.shape = {2, 3};
  w.dtype = DType::f32;
  w.persistable = w.is_parameter = true;
  p.add_var(w);
  VarDesc slot = w;
  slot.name = "optimizer.exp_avg.fc.weight";
  slot.is_parameter = false;
  p.add_var(slot);
  amp::declare_scaler_state(p, config().loss_scaler_config());
  return p;
}

// The scope a new run starts from, its values all different from a saved one's.
Scope fresh_scope() {
  Scope s;
  s.set("fc.weight", Tensor::from_floats({2, 3}, {0, 0, 0, 0, 0, 0}));
  s.set("optimizer.exp_avg.fc.weight", Tensor::from_floats({2, 3}, {0, 0, 0, 0, 0, 0}));
  amp::LossScalerState fresh;
  fresh.scale = config().loss_scaler_config().init_loss_scaling;
  s.set(amp::ScalerVars::scale, Tensor::from_floats({1}, {fresh.scale}));
  for (const char* name : {amp::ScalerVars::good_steps, amp::ScalerVars::bad_steps, amp::ScalerVars::skipped,
                           amp::ScalerVars::skips_at_min}) {
    Tensor t = Tensor::empty({1}, DType::i64);
    t.data<int64_t>()[0] = 0;
    s.set(name, t);
  }
  return s;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> own_seeds() {
  std::vector<std::pair<std::string, std::string>> seeds;
  const Program p = resume_program();
  for (const bool amp : {true, false}) {
    Scope s = fresh_scope();
    s.set("fc.weight", Tensor::from_floats({2, 3}, {0.5f, -1.25f, 3, 1e-3f, -7, 65504}));
    s.set("optimizer.exp_avg.fc.weight", Tensor::from_floats({2, 3}, {1, 2, 3, 4, 5, 6}));
    amp::LossScalerState state;
    state.scale = 4096;
    state.good_steps = 17;
    state.bad_steps = 2;
    state.skipped_steps = 3;
    amp::write_scaler_state(s, state);
    const int64_t steps_done = amp ? 40 : 3, steps_per_epoch = 10;
    const io::Metadata meta =
        launch::checkpoint_metadata(config(), kWorld, kTrainingExamples, steps_done, steps_per_epoch, s, amp);
    const std::string path = (scratch_dir() / "seed.safetensors").string();
    io::save_checkpoint(path, p, s, meta);
    seeds.emplace_back(amp ? "amp_step40.safetensors" : "no_scaler_step3.safetensors", test::read_bytes(path));
  }
  return seeds;
}

Outcome run_one(const std::string& bytes) {
  const std::string path = write_input("checkpoint.safetensors", bytes);
  static const Program program = resume_program();
  Scope scope = fresh_scope();
  return refused_naming(path, [&] {
    const int64_t step = launch::resume_from_checkpoint(path, config(), program, scope, kWorld, kTrainingExamples,
                                                        /*amp=*/true, /*log=*/false);
    if (step < 0) throw ContractBroken("resumed at step " + std::to_string(step));
    const amp::LossScalerState s = amp::read_scaler_state(scope);
    if (!(std::isfinite(s.scale) && s.scale > 0) || s.good_steps < 0 || s.bad_steps < 0 || s.skipped_steps < 0)
      throw ContractBroken("resumed with a loss scale of " + std::to_string(s.scale) + " or a negative count");
    for (const char* name : {"fc.weight", "optimizer.exp_avg.fc.weight"})
      for (float v : scope.get(name).to_floats())
        if (!std::isfinite(v)) throw ContractBroken(std::string("resumed ") + name + " with a non-finite value");
  });
}

}  // namespace mix::fuzz
