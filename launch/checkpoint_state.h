#pragma once
// What mixtrain's checkpoints carry besides their tensors (runtime/io/checkpoint.h
// writes and reads those): the step and the place in the data, the settings a
// resumed run must share with the run that saved it, and the loss scaler's
// state. --save writes them into the header's metadata; --resume checks them
// and restores them.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "launch/train_config.h"
#include "runtime/io/checkpoint.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"

namespace mix::launch {

/// What fixes a run's data order (seed, shuffle flag, training set size), its
/// place in it after a step (batch size, rank count) and its optimizer state:
/// saved in every checkpoint, compared when one is resumed.
std::vector<std::pair<std::string, std::string>> resume_settings(const TrainConfig& c, int world,
                                                                 int64_t training_examples);

/// The metadata of a checkpoint saved after `steps_done` steps: the step, the
/// epoch and batch within it, resume_settings and, with `amp`, the loss
/// scaler's state as `scope` holds it.
io::Metadata checkpoint_metadata(const TrainConfig& c, int world, int64_t training_examples, int64_t steps_done,
                                 int64_t steps_per_epoch, const Scope& scope, bool amp);

/// --resume `path` (c.resume, or the file --resume auto chose): checks that it
/// has its step (a file without one, such as a plain safetensors file, throws
/// UsageError pointing at --init-from), then that the checkpoint continues this run (a
/// resume setting that differs throws UsageError naming it, before any tensor
/// is read), loads its parameters and optimizer state into `scope` and, with
/// `amp`, the scaler's state (a fresh scaler when it holds none). Returns the
/// step it was saved after. `log`: say so (rank 0).
int64_t resume_from_checkpoint(const std::string& path, const TrainConfig& c, const Program& program, Scope& scope,
                               int world, int64_t training_examples, bool amp, bool log);

/// A loss scale as text that reads back as the same FP32 value (9 digits).
std::string loss_scale_text(float scale);

}  // namespace mix::launch
