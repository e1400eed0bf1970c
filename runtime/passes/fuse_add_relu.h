#pragma once
// fuse_add_relu, a pass over the whole training program (after autodiff and
// gradient sync), for the ends of residual blocks. A ResNet block ends in
//   forward    t = elementwise_add(branch, shortcut);  out = relu(t)
//   backward   g = sum(g_part0, g_part1);               dx = relu_grad(out, g)
// (the backward sum adds the two gradients of the block's input, which feeds
// both the next block's branch and its shortcut). The pass replaces each pair
// with one op of runtime/ops/fused_add_relu.cc:
//   out = fused_add_relu(branch, shortcut)
//   dx  = fused_sum_relu_grad(out, [g_part0, g_part1])
// when the intermediate (t or g) has no other reader, is neither persistable
// nor kept by the caller, the add does not broadcast, and nothing but
// collective ops (gradient all-reduces) lies between the two ops: the fused
// op runs at the second op's place, so the first one's inputs must still hold
// their values there. In the programs mixtrain builds the two are adjacent,
// or a bucket's all-reduce starts between them.
//
// Why: the intermediate is never written nor read back. Per element of a
// block's output that is 4 bytes of memory traffic less in FP16 forward and
// 4 backward (8 and 8 in FP32): for ResNet-50 at batch 64 in AMP about 2.8 GB
// a step, a tenth of the step's traffic by a rough count of the bytes each op
// reads and writes, and 31 kernel launches fewer. The values are the same
// bits (runtime/ops/fused_add_relu.cc says why).
//
// Run after autodiff, on the program the executor runs: relu's gradient reads
// relu's output, not t, so t has one reader there; fused ops have no gradient.
// mixtrain runs it unless `--no-fuse-add-relu`; `--print-program` shows the
// fused ops.
#include <set>
#include <string>

#include "runtime/ir/program.h"

namespace mix {

/// How many pairs fuse_add_relu fused.
struct FusedAddRelu {
  int forward = 0;   // elementwise_add + relu -> fused_add_relu
  int backward = 0;  // sum + relu_grad -> fused_sum_relu_grad
};

/// Fuses the pairs described above in `p`; `keep` names variables the caller
/// reads after a run (never fused away).
FusedAddRelu fuse_add_relu(Program& p, const std::set<std::string>& keep);

}  // namespace mix
