#pragma once
// Reverse-mode autodiff over the program IR. Each op type's gradient maker is
// registered beside its forward (runtime/ops/<op>.cc); this pass walks the
// forward ops backwards, asks each maker for its gradient ops, and sums the
// contributions of variables used more than once.
#include <string>
#include <vector>

#include "runtime/ir/program.h"

namespace mix {

struct BackwardResult {
  /// (parameter, gradient variable) for every trainable parameter reached from the loss.
  std::vector<std::pair<std::string, std::string>> param_grads;
  /// Index of the first gradient op.
  size_t first_backward_op = 0;
};

/// Appends gradient ops for d(loss)/d(every parameter). The gradient of `loss`
/// itself, `loss@GRAD`, must be produced by an op the caller appends first
/// (a fill of ones, or the loss scale under AMP): see seed_loss_gradient.
BackwardResult append_backward(Program& p, const std::string& loss);

/// Appends the op that seeds loss@GRAD: a constant 1, or the value of the
/// variable `scale_var` (the loss scale) when given; either times
/// `multiplier` (1/K when K micro-batches make one step: each loss counts 1/K).
void seed_loss_gradient(Program& p, const std::string& loss, const std::string& scale_var = "",
                        double multiplier = 1.0);

}  // namespace mix
