#pragma once
// The overflow-provenance mask that c_allreduce_found_inf all-reduces: which
// ranks saw a non-finite gradient, overall and per parameter. Written once for
// host and device (MIX_HD); the CPU and CUDA kernels both use it.
//
// Layout: int32 [1 + params, words], words = ceil(world / 32). Row 0 holds the
// ranks whose local found_inf was raised; row 1 + j the ranks where parameter
// j's gradient held an inf or NaN. Rank r is bit r % 32 of word r / 32.
//
// Each rank sets only its own bit, so summing every rank's mask adds disjoint
// bits: no carry ever happens and the sum is the bitwise OR. That lets one
// all-reduce of int32 sum (which NCCL and MPI both have; NCCL has no OR) carry
// the global flag and the provenance together.
#include <cstdint>

#include "runtime/core/half.h"

namespace mix::collective {

MIX_HD int overflow_mask_words(int world) { return (world + 31) / 32; }

MIX_HD void mark_rank(int32_t* row, int rank) {
  row[rank / 32] = static_cast<int32_t>(static_cast<uint32_t>(row[rank / 32]) | (1u << (rank % 32)));
}

MIX_HD bool has_rank(const int32_t* row, int rank) {
  return ((static_cast<uint32_t>(row[rank / 32]) >> (rank % 32)) & 1u) != 0;
}

MIX_HD bool any_rank(const int32_t* row, int words) {
  for (int w = 0; w < words; ++w)
    if (row[w] != 0) return true;
  return false;
}

}  // namespace mix::collective
