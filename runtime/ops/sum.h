#pragma once
// sum's arithmetic on the CPU, shared by sum (runtime/ops/sum.cc) and
// fused_sum_relu_grad (runtime/ops/fused_add_relu.cc): X0 + X1 + ... added in
// FP32 in input order, so that the two ops round the same FP32 value.
#include <string>
#include <vector>

#include "runtime/core/tensor.h"

namespace mix {

/// The elementwise FP32 sum of `xs` (one dtype and size, at least one tensor);
/// `op` names the op in error messages.
std::vector<float> sum_in_f32(const std::vector<const Tensor*>& xs, const std::string& op);

}  // namespace mix
