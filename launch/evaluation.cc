#include "launch/evaluation.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "runtime/data/batch_feeder.h"

namespace mix::launch {

namespace {

constexpr const char* kEvalCorrect = "eval.correct";

// [n, per_example...]
Shape batched(int64_t n, const Shape& per_example) {
  Shape s{n};
  s.insert(s.end(), per_example.begin(), per_example.end());
  return s;
}

Program count_correct_program(const Program& program, const models::Model& model) {
  Program p;
  p.add_var(program.var(model.logits));
  p.add_var(program.var(model.label));
  // A padded vocabulary's logits have more columns than the model has classes: the padding is never a prediction.
  std::map<std::string, Attr> attrs;
  const Shape& logits = program.var(model.logits).shape;
  if (!logits.empty() && logits.back() > model.num_classes) attrs["valid_classes"] = model.num_classes;
  p.append_op(make_op("top1_correct", {{"Logits", {model.logits}}, {"Label", {model.label}}},
                      {{"Correct", {kEvalCorrect}}}, std::move(attrs)));
  return p;
}

}  // namespace

void feed_batch(Scope& scope, const models::Model& model, const data::Batch& batch) {
  const int64_t n = batch.inputs.dim(0);
  scope.set(model.input, batch.inputs.reshaped(batched(n, model.example_shape)));
  scope.set(model.label, batch.labels.reshaped(batched(n, model.label_shape)));
}

TestSetEvaluation::TestSetEvaluation(const Program& program, const models::Model& model, const data::Dataset& test,
                                     collective::Communicator& comm, int64_t batch, int64_t max_batches,
                                     Allocator* batch_memory)
    : model_(model),
      test_(test),
      comm_(comm),
      batch_(batch),
      max_batches_(max_batches),
      batch_memory_(batch_memory),
      forward_(program, {model.logits, model.loss, model.label}, forward_ops),
      count_correct_program_(count_correct_program(program, model)),
      count_correct_(count_correct_program_, {kEvalCorrect, model.logits, model.label}) {}

EvalResult TestSetEvaluation::run(Scope& scope, ExecEnv& env) const {
  EvalResult r;
  if (test_.size() == 0) return r;
  struct RestoreEnv {
    ExecEnv& env;
    std::map<std::string, double>* profile;
    ~RestoreEnv() {
      env.op_seconds = profile;
      env.training = true;
    }
  } restore{env, env.op_seconds};
  env.op_seconds = nullptr;
  const int rank = comm_.rank(), world = comm_.world_size();
  std::vector<int64_t> idx;
  for (int64_t i = rank; i < test_.size(); i += world) idx.push_back(i);
  if (max_batches_ > 0) idx.resize(std::min<size_t>(idx.size(), static_cast<size_t>(max_batches_ * batch_)));
  // Counts summed over ranks as integers (exact at any size), the loss as FP32.
  int64_t counts[3] = {0, 0, 0};  // correct predictions, labels (rows of logits), examples
  double loss_sum = 0;
  // Batches gathered and uploaded ahead, as in training.
  const int64_t examples = static_cast<int64_t>(idx.size());
  const auto indices = std::make_shared<const std::vector<int64_t>>(std::move(idx));
  const int64_t batch = batch_;
  const auto batch_of = [indices, examples, batch](int64_t b) {
    const int64_t begin = b * batch;
    return data::BatchRequest{indices, begin, std::min(batch, examples - begin)};
  };
  data::BatchFeeder feeder(test_, env.device, batch_memory_, batch_of, 0, (examples + batch - 1) / batch);
  for (int64_t b = 0; b < examples; b += batch) {
    const data::Batch& examples_in = feeder.next();
    feed_batch(scope, model_, examples_in);
    env.training = false;  // batch_norm: the running statistics, no updates
    forward_.run(scope, env);
    env.training = true;
    count_correct_.run(scope, env);
    const Tensor& logits = scope.get(model_.logits);
    const int64_t n = examples_in.inputs.dim(0);
    counts[0] += scope.get(kEvalCorrect).to(cpu_device()).data<int64_t>()[0];
    counts[1] += logits.numel() / logits.dim(-1);  // one row per label
    counts[2] += n;
    loss_sum += static_cast<double>(scope.get(model_.loss).item_float()) * static_cast<double>(n);
  }
  comm_.all_reduce(counts, 3, DType::i64, collective::ReduceOp::sum);
  float loss_total = static_cast<float>(loss_sum);
  comm_.all_reduce(&loss_total, 1, DType::f32, collective::ReduceOp::sum);
  r.examples = counts[2];
  r.accuracy = counts[1] > 0 ? static_cast<double>(counts[0]) / static_cast<double>(counts[1]) : 0;
  r.loss = counts[2] > 0 ? loss_total / static_cast<float>(counts[2]) : 0;
  return r;
}

}  // namespace mix::launch
