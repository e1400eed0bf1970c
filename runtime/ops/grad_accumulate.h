#pragma once
// grad_accumulate: gradient accumulation over the micro-batches of one
// optimizer step (--grad-accum-steps K), in FP32 accumulators whatever the
// gradients' dtype.
//
//   mode "add"     Accum += X               the K-1 micro-batches before the last
//   mode "finish"  X = Accum + X, Accum = 0  the last, right before X's all-reduce
//
// X are gradients of any floating dtype (the FP16 weight gradients under AMP,
// which the all-reduce then sends as FP16); Accum are FP32 tensors of X's
// shapes, persistable across the micro-batches. The sum of K micro-batches is
// held in FP32 and rounded to X's dtype once, by "finish"; an inf or NaN in
// any micro-batch stays in it, so the step's overflow check sees it. Outputs:
// AccumOut (= Accum, in place), and with "finish" Out (= X, in place).
#include <string>

namespace mix {

struct OpDesc;

/// Whether the op's mode is "finish" (false: "add"); any other mode throws,
/// on the CPU and on CUDA alike.
bool grad_accumulate_finishes(const OpDesc& op);

/// The accumulator of gradient variable `grad`: persistable, zero between
/// optimizer steps, and not saved in checkpoints (io/checkpoint.cc).
inline constexpr const char* kGradAccumPrefix = "grad_accum.";
inline std::string grad_accumulator_name(const std::string& grad) { return kGradAccumPrefix + grad; }

}  // namespace mix
