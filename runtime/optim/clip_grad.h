#pragma once
// The gradient norm and gradient clipping of the training step, after the
// all-reduce and the unscale, before the loss scaler's update and the
// optimizer (launch/train_program.cc): torch.nn.utils.clip_grad_norm_ and
// clip_grad_value_ on the FP32 gradients the optimizer reads.
//
//   grad_global_norm     X: FP32 gradients -> Norm f32 [1], the L2 norm of all
//                        of them: sqrt of the sum of squares, summed in FP64
//                        (one rounding, to FP32, at the end)
//   clip_by_global_norm  X (in place), Norm, attr max_norm C, optional
//                        FoundInfinite (in place): X *= min(1, C / (Norm + 1e-6)),
//                        the coefficient computed in FP32 as torch computes it;
//                        a non-finite Norm raises FoundInfinite (the step is
//                        skipped, as an overflow) and leaves X alone
//   clip_by_value        X (in place), attr max_value V: X = clamp(X, -V, V); a
//                        NaN stays NaN (the overflow check sees it)
//
// The gradients are the same on every rank after the all-reduce, so their
// norm is too: no collective is needed. On a GPU the norm and the coefficient
// never leave the device (runtime/optim/cuda/clip_grad.cu).
#include <string>
#include <vector>

#include "runtime/ir/program.h"

namespace mix::optim {

/// The variable grad_global_norm writes: the metrics' grad_norm.
inline constexpr const char* kGradNorm = "grad_norm";

/// Appends grad_global_norm of `grads` into kGradNorm.
void append_grad_norm(Program& p, const std::vector<std::string>& grads);

/// Appends clip_by_global_norm of `grads` by kGradNorm to `max_norm`; a
/// non-finite norm raises `found_inf`: ORed into it when an earlier op writes
/// it (the AMP step's), else written by the clip alone (FP32 training).
void append_clip_by_global_norm(Program& p, const std::vector<std::string>& grads, double max_norm,
                                 const std::string& found_inf);

/// Appends clip_by_value of `grads` to [-max_value, max_value].
void append_clip_by_value(Program& p, const std::vector<std::string>& grads, double max_value);

}  // namespace mix::optim
