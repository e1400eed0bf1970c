// The one-line AMP switch, on a whole (if small) training loop.
//
// This program trains an MLP on synthetic data twice: once in FP32 and once
// in mixed precision. The training program's options differ in one line,
// the precision (mixtrain's --precision); launch/train_program.cc builds both.
// It prints both losses and the AMP program's casts.
//   build/example_amp_mlp
#include <cstdio>
#include <string>

#include "collective/communicator.h"
#include "launch/train_program.h"
#include "models/model.h"
#include "runtime/data/dataset.h"
#include "runtime/exec/executor.h"
#include "runtime/exec/init.h"

using namespace mix;

static float train(bool use_amp) {
  auto comm = collective::make_local_communicator();
  data::TrainTest data = data::make_synthetic(4096, 512, 32, 4, /*seed=*/7);
  models::Model model = models::build_mlp({/*in_features=*/32, /*hidden=*/{64}, /*num_classes=*/4});

  launch::TrainProgramOptions options;  // momentum 0.9, the gradient all-reduce for one rank
  options.precision = use_amp ? amp::Precision::amp : amp::Precision::fp32;  // <- the one line
  const launch::TrainProgram train = launch::build_train_program(model.program, model.loss, options);

  Scope scope;
  initialize_persistables(model.program, scope, /*seed=*/1);
  scope.get(optim::kLearningRate).data<float>()[0] = 0.05f;
  Executor step(model.program, train.read_back);
  ExecEnv env;
  env.comm = comm.get();

  data::DistributedSampler sampler(data.train.size(), 0, 1, /*shuffle=*/true, /*seed=*/1);
  std::vector<int64_t> order = sampler.indices(0);
  Tensor x, y;
  float loss = 0;
  const int64_t batch = 64;
  for (int64_t b = 0; b + batch <= static_cast<int64_t>(order.size()); b += batch) {
    data::gather_batch(data.train, order, b, batch, x, y);
    scope.set(model.input, x);
    scope.set(model.label, y.reshaped({batch, 1}));
    env.step = b / batch + 1;
    step.run(scope, env);
    loss = scope.get(model.loss).item_float();
  }
  int casts = 0;
  for (auto& op : model.program.ops()) casts += op.type == "cast";
  std::printf("%-4s final loss %.4f, %d cast ops in the program\n", use_amp ? "amp" : "fp32", loss, casts);
  return loss;
}

int main() {
  const float fp32 = train(false);
  const float amp = train(true);
  // Both must have learnt the task (chance level is ln 4 = 1.386).
  return fp32 < 1.0f && amp < 1.0f ? 0 : 1;
}
