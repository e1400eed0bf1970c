#pragma once
// Whether a tensor's storage is written over a span of a program: what a pass
// must know before it moves a read of that tensor across the span (a folded
// cast's reader reads the narrow input later, a fused cast reads a weight
// earlier, a recomputed softmax reads the logits in backward).
//
// Names are not enough: a view (reshape2, flatten, elementwise_add_grad's
// pass-through gradient) shares its input's storage, and an op may write its
// output in place of its input (scale with X == Out), so writing a view
// writes the tensor it views, and the other way round.
#include <string>

#include "runtime/ir/program.h"

namespace mix {

/// Whether an op strictly between `from` and `to` writes `var` or a variable
/// sharing its storage (what it is a view of, up the chain, and every view of
/// those). Making a view is not a write.
bool storage_written_between(const Program& p, const std::string& var, size_t from, size_t to);

/// Whether an op strictly between `from` and `to` reads or writes `var` by
/// name: what a pass must know before it makes an op write `var` earlier or
/// later than the op that wrote it.
bool named_between(const Program& p, const std::string& var, size_t from, size_t to);

}  // namespace mix
