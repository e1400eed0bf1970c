#pragma once
// Optimizers append their update ops to a training program: the last part of
// the step that launch/train_program.cc builds. The update ops run on the
// FP32 master parameters and, when given a SkipUpdate flag (the global
// found_inf of AMP), leave parameters and optimizer state untouched on an
// overflow step.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/enum_names.h"
#include "runtime/ir/program.h"

namespace mix::optim {

/// (parameter, gradient variable) pairs.
using ParamGrads = std::vector<std::pair<std::string, std::string>>;

/// Names of the variables every training program has.
inline constexpr const char* kLearningRate = "learning_rate";  // f32 [1], set by the trainer each step
inline constexpr const char* kOptimizerStep = "optimizer.step"; // i64 [1], steps actually applied

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;

  /// Appends the update ops. `skip` (i32 [1], nonzero = skip) may be empty.
  virtual void append_update_ops(Program& p, const ParamGrads& grads, const std::string& skip) = 0;

  /// Leaves parameters of fewer than two dimensions (biases, and the scales and
  /// shifts of batch_norm and layer_norm) out of weight decay, as timm, Hugging
  /// Face's Trainer and nanoGPT do; weight matrices, filters and embeddings keep
  /// it. Off by default: torch.optim decays every parameter it is given.
  void set_no_decay_1d(bool on) { no_decay_1d_ = on; }

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

enum class OptimizerKind { sgd, momentum, adamw };

inline constexpr NamedValue<OptimizerKind> kOptimizerNames[] = {
    {OptimizerKind::sgd, "sgd"}, {OptimizerKind::momentum, "momentum"}, {OptimizerKind::adamw, "adamw"}};

inline std::string_view to_string(OptimizerKind k) { return name_of(k, kOptimizerNames); }

/// An optimizer as mixtrain's flags describe it (--optimizer, --momentum,
/// --weight-decay, --no-decay-1d).
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::momentum;
  double momentum = 0.9;                       // momentum only
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw only: torch.optim.AdamW's defaults
  std::optional<double> weight_decay;   // unset: 0, and 0.01 for adamw (torch.optim.AdamW's default)
  bool no_decay_1d = false;
  double effective_weight_decay() const {
    return weight_decay ? *weight_decay : kind == OptimizerKind::adamw ? 0.01 : 0.0;
  }
};

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& o);

}  // namespace mix::optim
