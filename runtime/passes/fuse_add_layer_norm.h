#pragma once
// fuse_add_layer_norm, a pass over the whole training program (after
// autodiff), for pre-LN Transformers: each
//   s = elementwise_add(a, b);  y, mean, var = layer_norm(s)
// becomes one
//   s, y, mean, var = fused_add_layer_norm(a, b)   (runtime/ops/fused_add_layer_norm.cc)
// where the layer_norm reads the add's output. Unlike the pairs of
// runtime/passes/fuse_pairs.h the sum stays an output: it is the residual
// stream, which the next residual add reads, and backward too (layer_norm_grad
// reads it as X). In a GPT that is the embeddings' add before the first block's
// ln_1, each block's attention residual before its ln_2, and each block's MLP
// residual before the next block's ln_1 or ln_f.
//
// Why: the layer norm reads the sum as the add writes it instead of reading it
// back from memory, and one kernel runs instead of two, as llm.c's fused
// residual + layernorm forward and torch.compile's fusion do (what that is
// worth for GPT-2: docs/design.md, "Fused add + layer norm").
//
// Values: the same bits (the op stores each rounded sum and normalises the
// stored values). Fused where the add is a residual add elementwise_add takes
// (Y of X's shape, X's dtype or FP16/BF16 beside an FP32 X, or X's trailing
// dims in X's dtype, as the position embedding), the layer_norm writes Mean
// and Variance, and no op between the two touches the layer norm's outputs or
// writes its Scale or Bias (the fused op runs where the add ran). mixtrain
// runs it unless `--no-fuse-add-layer-norm`.
#include "runtime/ir/program.h"

namespace mix {

/// Fuses the pairs described above in `p`; returns how many.
int fuse_add_layer_norm(Program& p);

}  // namespace mix
