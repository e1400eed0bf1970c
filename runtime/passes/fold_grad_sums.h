#pragma once
// fold_grad_sums, a pass over the whole training program (after autodiff):
// where a variable feeds two ops, autodiff writes its gradient in two parts
// and adds them with a `sum`. Where the part written last comes from an op
// that can add the other part itself (input Accumulate: layer_norm_grad's
// X@GRAD, lookup_table_grad's W@GRAD), that op takes the other part and
// writes the whole gradient, and the sum goes:
//   a = ...;  b = layer_norm_grad(...);  g = sum(a, b)
// becomes
//   a = ...;  g = layer_norm_grad(..., Accumulate=a)
// In a pre-LN Transformer that is every residual-stream gradient: the part
// through the block's layer norm plus the part that skips the block. With a
// tied output layer, the token embedding's gradient is the FP16 (or BF16)
// gradient of the output layer's weight cast to FP32 plus lookup_table_grad's
// part; the pass also folds that cast (lookup_table_grad widens its
// Accumulate on load), so the FP16 part, not an FP32 copy, waits through
// backward for the embedding's gradient.
//
// Why: each folded sum is a kernel fewer, and the part the op wrote is never
// written and read back (what that is worth for GPT-2: docs/design.md,
// "Folded gradient sums").
//
// Values: the op rounds its own part as it would have stored it and adds the
// other in FP32, rounded once, as `sum` adds them (fn::add_grad_part): the
// same bits.
//
// Folded only where the sum has exactly two parts; the last-written part has
// no other reader, one writer, and is neither persistable nor kept by the
// caller; the two parts have one dtype and shape; the other part is not
// written between the op and the sum (storage_written_between), and nothing
// between them touches the sum's output. A cast is folded only where its
// FP32 output has no other reader and its input still holds the same values
// when the op runs. mixtrain runs it unless `--no-fold-grad-sums`.
#include <set>
#include <string>

#include "runtime/ir/program.h"

namespace mix {

struct FoldedGradSums {
  int sums = 0;   // sums removed: their two parts added by the op that writes the second
  int casts = 0;  // widening casts of the other part removed with them
};

/// Folds the sums described above in `p`; `keep` names variables the caller
/// reads after a run (never folded away).
FoldedGradSums fold_grad_sums(Program& p, const std::set<std::string>& keep);

}  // namespace mix
