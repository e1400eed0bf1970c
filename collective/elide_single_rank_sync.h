#pragma once
// elide_single_rank_sync, the last pass of the training program
// (launch/train_program.cc), run at world size 1 only: it takes out each
// gradient bucket's c_allreduce_start / c_allreduce_wait pair.
//
// One rank's sum is its own gradients. With both of the pair's scales 1 (what
// the data-parallel pass gives one rank: F = world = 1) the pair is the
// identity, and on one rank all it does is copy: a bucket of several gradients
// is packed into its Buffer and unpacked back, and the Buffer is a second copy
// of the bucket from its start to its wait. Without the pair the program
// computes the same bits and moves none of those bytes, as PyTorch without
// DDP and llm.c on one GPU do. A pair with other scales stays: multiplying by
// 1/F and then by F rounds twice (--grad-predivide F on one rank).
//
// It runs after every pass that finds the buckets by their all-reduces (the
// unscale after each wait, gradient accumulation's "finish" before each
// start), so those passes build the program a job of several ranks runs, and
// the micro-batch program (collective/grad_accumulation_pass.h) is derived
// from the "finish" ops, which stay. The found_inf all-reduce stays too: it
// also writes which ranks overflowed.
//
// mixtrain runs it on one rank unless --no-elide-single-rank-sync, which keeps
// the pairs (to time what a sync costs on one rank, or to test its ops there).
#include "runtime/ir/program.h"

namespace mix::collective {

/// Removes every gradient c_allreduce_start / c_allreduce_wait pair whose
/// scales are 1 and whose wait writes the bucket in place; returns how many
/// pairs it removed. Call it only for a program of world size 1.
int elide_single_rank_sync(Program& p);

}  // namespace mix::collective
