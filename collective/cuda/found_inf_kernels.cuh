#pragma once
// The maps of c_allreduce_found_inf (found_inf_allreduce_op.cu's header says
// how the mask is zeroed, marked, reduced and read, all on the device). Like
// runtime/ops/cuda/row_group.cuh they need no CUDA header, so
// tests/unit/test_found_inf_kernels_emulated.cc runs this same source on the CPU.
#include <cstdint>

#include "collective/overflow_mask.h"

namespace mix::collective {

/// Bucket k's flags into the mask: thread 0 marks row 0 when the bucket's
/// FoundInfinite is raised, thread i (< n) marks row first_row + i when its
/// gradient's FoundInfiniteEach entry is (each == nullptr: no per-parameter
/// flags). Launched over max(n, 1) threads.
struct FoundInfMarkBucket {
  const int32_t* flag;
  const int32_t* each;
  int64_t n;
  int32_t* mask;
  int64_t first_row;
  int words;
  int rank;
  __device__ void operator()(int64_t i) const {
    if (i == 0 && flag[0] != 0) mark_rank(mask, rank);
    if (each && i < n && each[i] != 0) mark_rank(mask + (first_row + i) * words, rank);
  }
};

/// Out = whether any rank's bit is set in row 0 (the global found_inf). One thread's work.
struct FoundInfAnyRank {
  const int32_t* mask;
  int words;
  int32_t* out;
  __device__ void operator()(int64_t) const { out[0] = any_rank(mask, words) ? 1 : 0; }
};

}  // namespace mix::collective
