#pragma once
// Optimizers append their update ops to a training program. The update ops run
// on the FP32 master parameters and, when given a SkipUpdate flag (the global
// found_inf of AMP), leave parameters and optimizer state untouched on an
// overflow step.
//
// minimize() is the whole training program builder: it seeds the loss
// gradient, runs autodiff, lets a gradient-sync pass (the data-parallel
// all-reduce, from collective/) rewrite the gradients, and appends the
// updates. amp::decorate wraps an Optimizer to make that program AMP.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/ir/program.h"

namespace mix::optim {

/// (parameter, gradient variable) pairs.
using ParamGrads = std::vector<std::pair<std::string, std::string>>;

/// A pass that gets the backward's gradients and returns those the update
/// must read (for data parallelism: the all-reduced ones).
using GradSyncPass = std::function<ParamGrads(Program&, const ParamGrads&)>;

/// Names of the variables every training program has.
inline constexpr const char* kLearningRate = "learning_rate";  // f32 [1], set by the trainer each step
inline constexpr const char* kOptimizerStep = "optimizer.step"; // i64 [1], steps actually applied

struct TrainProgram {
  ParamGrads param_grads;    // after sync: what the update reads
  std::string loss;
  std::string found_inf;     // empty in FP32 training: every step applies
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;

  /// Builds the training program from a forward program ending in `loss`.
  virtual TrainProgram minimize(Program& p, const std::string& loss, const GradSyncPass& sync = {});

  /// Appends the update ops. `skip` (i32 [1], nonzero = skip) may be empty.
  virtual void append_update_ops(Program& p, const ParamGrads& grads, const std::string& skip) = 0;

  /// Leaves parameters of fewer than two dimensions (biases, and the scales and
  /// shifts of batch_norm and layer_norm) out of weight decay, as timm, Hugging
  /// Face's Trainer and nanoGPT do; weight matrices, filters and embeddings keep
  /// it. Off by default: torch.optim decays every parameter it is given.
  /// Wrappers (amp::decorate) pass it on to the optimizer they wrap.
  virtual void set_no_decay_1d(bool on) { no_decay_1d_ = on; }

 protected:
  /// `weight_decay`, or 0 for `param` when set_no_decay_1d leaves it out.
  double weight_decay_of(const Program& p, const std::string& param, double weight_decay) const;
  /// The parameters in groups of one weight decay (weight_decay_of), in the
  /// order each group first appears, parameters in their order within it: one
  /// update op per group.
  struct UpdateGroup {
    double weight_decay = 0;
    std::vector<std::string> params, grads;
  };
  std::vector<UpdateGroup> update_groups(const Program& p, const ParamGrads& grads, double weight_decay) const;
  /// Declares a zero-initialised persistable FP32 slot `optimizer.<slot>.<param>` shaped like the parameter.
  std::string declare_slot(Program& p, const std::string& slot, const std::string& param);
  /// Declares learning_rate and optimizer.step, and appends the op that counts
  /// applied steps (skipped when `skip` says the step overflowed).
  void declare_common(Program& p, const std::string& skip);

 private:
  bool no_decay_1d_ = false;
};

std::unique_ptr<Optimizer> make_sgd(double weight_decay = 0);
std::unique_ptr<Optimizer> make_momentum(double momentum, double weight_decay = 0, bool nesterov = false);
std::unique_ptr<Optimizer> make_adamw(double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8,
                                      double weight_decay = 0.01);

}  // namespace mix::optim
