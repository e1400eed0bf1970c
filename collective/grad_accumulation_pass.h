#pragma once
// Gradient accumulation (--grad-accum-steps K), a pass of the training
// program after the gradient all-reduce pass (launch/train_program.cc): K
// micro-batches of forward and backward make one optimizer step, and the
// gradients are all-reduced once, during the last micro-batch's backward, as
// PyTorch DDP's no_sync does for the others.
//
// The step's program (the last micro-batch's) gets, right before each
// gradient bucket's c_allreduce_start, a grad_accumulate "finish" that adds
// the FP32 sum of the earlier micro-batches to the bucket's gradients, in
// place, and zeroes it (runtime/ops/grad_accumulate.h). The bucket then sends
// what it sends without accumulation: under AMP the FP16 gradients, so the
// bytes a step stay those of K = 1 and half of FP32's.
//
// micro_batch_program() derives from that program the one the K - 1 earlier
// micro-batches run: its forward and backward, each bucket's "finish" replaced
// by a grad_accumulate "add" of the bucket's gradients into their FP32
// accumulators, and nothing after backward (no all-reduce, unscale, scaler
// update or optimizer). Every whole-step pass has run by then, so both
// programs run the same forward and backward ops.
#include "runtime/ir/program.h"

namespace mix::collective {

/// Inserts the "finish" ops and declares the accumulators (FP32,
/// persistable, zero); returns how many gradients they accumulate. The
/// program must have its gradient all-reduces (insert_grad_allreduce).
int insert_grad_accumulation(Program& p);

/// The program of a micro-batch before the last, from the step's program
/// after insert_grad_accumulation (and any later pass).
Program micro_batch_program(const Program& step);

}  // namespace mix::collective
