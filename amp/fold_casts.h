#pragma once
// amp::fold_widening_casts, the pass after amp::rewrite: removes each FP16 (or
// BF16) -> FP32 cast whose one reader widens its input on load anyway, and
// has that reader take the FP16 variable itself with attr out_dtype "f32"
// (runtime/ops/widening.h). The readers that can: softmax's X and
// softmax_with_cross_entropy's Logits, the black-list ops that follow FP16
// matmuls in attention and at the loss; and elementwise_add beside an FP32
// operand of the same shape, a Transformer's residual add of a block's FP16
// output (the add reads that output as its Y, FP16, and writes FP32; its
// gradient rounds dY once to FP16). A cast with several readers stays:
// their gradients must be added in FP32 and rounded to FP16 once, by the
// cast's gradient.
//
// Why: the program then computes the same values bit for bit (widening is
// exact; the reader's gradient rounds to FP16 once, as the removed cast's
// gradient would), but never writes or reads an FP32 copy of the input, nor
// the FP32 gradient of that copy. Per element that is 16 bytes of memory
// traffic a step (the cast's read and write, the wider read, and the same
// again for the gradient), and the executor's planned peak drops by 2 bytes
// per element where that tensor sets it. A language model's logits
// [tokens, vocab] are the largest tensor of the step. The ops still compute in
// FP32, as the black list says; `--print-program` shows the reader with
// out_dtype="f32" where the cast was.
//
// Run before autodiff, so that the gradient ops are made for the folded
// program.
//
// amp::fold_widening_grad_casts, after autodiff, does the same for one
// backward cast: attention's FP32 probabilities reach their FP16 matmul
// through a cast, so their gradient comes back FP16 and is cast to FP32 for
// softmax_grad, which widens Out@GRAD on load anyway. softmax_grad then reads
// the FP16 gradient: 8 bytes of traffic less per element (the cast's read and
// write, and the wider read), the same bits.
//
// amp::fold_casts_into_producers, after amp::fold_widening_casts, folds a cast
// the other way: into the op that writes its input. image_normalize is in no
// AMP list, so amp::rewrite keeps it FP32 and casts its output to FP16 for the
// white conv2d after it; layer_norm is black, so its FP32 output is cast to
// FP16 for the white matmul after it (each Transformer block's two, and the
// final one). Both compute each value in FP32 and round once on store to
// their out_dtype, so writing FP16 themselves gives the cast's bits, and the
// FP32 copy is never written or read (8 bytes of traffic per element, and its
// bytes off the planned peak). layer_norm's gradient then reads the FP16
// gradient of its output and widens it on load, as the removed cast's
// gradient widened it: 8 bytes per element less again, the same bits.
// Folded only where the cast is the FP32 value's one reader.
//
// `--no-fold-casts` turns all three off, keeping amp::rewrite's program as
// Paddle makes it.
#include "runtime/ir/program.h"

namespace mix::amp {

/// Folds the forward casts described above; returns how many casts it removed.
int fold_widening_casts(Program& p);

/// Folds the backward casts into softmax_grad's Out@GRAD; returns how many it removed.
int fold_widening_grad_casts(Program& p);

/// Folds the forward casts described above into the ops that write their
/// inputs; returns how many casts it removed.
int fold_casts_into_producers(Program& p);

}  // namespace mix::amp
