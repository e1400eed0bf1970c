#pragma once
// recompute_softmax, a pass over the whole training program (after autodiff):
// softmax_with_cross_entropy stops storing its Softmax output for the
// gradient, and the gradient recomputes it from the logits.
//
// Paddle's op writes Softmax [rows, classes], in FP32 under AMP (the op is on
// the black list), and its grad reads it back. For a language model that is
// the largest tensor of the step: the Transformer-base check's 8192 tokens x
// 32768 classes is 1 GiB in FP32. After the pass the forward writes RowStats
// instead (f32 [rows, 2]: each row's max and sum(exp(x - max)), which it
// computes anyway), and softmax_with_cross_entropy_grad reads Logits and
// RowStats in place of Softmax, recomputing each value as the forward would
// have stored it (attr softmax_dtype): the same bits
// (runtime/ops/softmax_with_cross_entropy.cc).
//
// Per element: the forward's 4-byte write is gone, and the gradient reads the
// logits (2 bytes under AMP, 4 in FP32) instead of the 4-byte softmax. The
// logits, not the softmax, now live from the forward to the gradient: under
// AMP with folded casts (amp/fold_casts.h) they are FP16, so the planned peak
// drops by 2 bytes per element where that tensor sets it; in FP32 they are the
// same size.
//
// Applied where the Softmax has no reader but the grad and is not kept by the
// caller, and the logits are written by one op only and are no view of
// another variable (so they still hold the forward's values when the grad
// runs). mixtrain runs it unless `--store-softmax`.
#include <set>
#include <string>

#include "runtime/ir/program.h"

namespace mix {

/// Rewrites each softmax_with_cross_entropy and its grad as described above;
/// returns how many pairs it rewrote.
int recompute_softmax(Program& p, const std::set<std::string>& keep);

}  // namespace mix
