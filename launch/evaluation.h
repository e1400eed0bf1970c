#pragma once
// mixtrain's evaluation on the test set: the forward ops only, batch_norm on
// its running statistics, each rank its share of the examples, the counts
// summed over ranks. Also how a batch of examples goes into the model's
// variables, for training and evaluation alike.
#include <cstdint>

#include "collective/communicator.h"
#include "models/model.h"
#include "runtime/core/allocator.h"
#include "runtime/data/batch_prefetcher.h"
#include "runtime/data/dataset.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/program.h"

namespace mix::launch {

/// Sets the model's input and label variables to `batch`'s examples, shaped
/// [n, ...model.example_shape] and [n, ...model.label_shape].
void feed_batch(Scope& scope, const models::Model& model, const data::Batch& batch);

struct EvalResult {
  double accuracy = 0;  // top-1, over every label (each token, for a language model)
  double loss = 0;      // mean over the examples
  int64_t examples = 0;
};

class TestSetEvaluation {
 public:
  /// Evaluates `model` (its training program `program`, which must outlive
  /// this) on `test`: rank r takes examples r, r + world, ..., in batches of
  /// `batch` (--eval-batch-size; TrainConfig::effective_eval_batch_size);
  /// `max_batches` > 0 stops each rank after that many (--eval-batches).
  /// `batch_memory`: as the training feeder's.
  TestSetEvaluation(const Program& program, const models::Model& model, const data::Dataset& test,
                    collective::Communicator& comm, int64_t batch, int64_t max_batches, Allocator* batch_memory);

  /// Runs the evaluation with `scope`'s parameters on `env`'s device; every
  /// rank gets the totals. Leaves `env` as it found it (training on, and the
  /// op profile, which is of training steps, without evaluation's ops).
  EvalResult run(Scope& scope, ExecEnv& env) const;

 private:
  const models::Model& model_;
  const data::Dataset& test_;
  collective::Communicator& comm_;
  int64_t batch_, max_batches_;
  Allocator* batch_memory_;
  Executor forward_;
  // Accuracy is counted where the logits are (top1_correct): each batch hands
  // back one integer, not its logits (a language model's are gigabytes on a GPU).
  Program count_correct_program_;
  Executor count_correct_;
};

}  // namespace mix::launch
