#pragma once
// A row's argmax as the maximum of one unsigned integer per element, written
// once for host and device (MIX_HD): top1_correct (runtime/ops/top1_correct.cc)
// takes the maximum over each row in order on the CPU (the largest value_rank
// per chunk, then its first index) and with a block reduction on the GPU. An
// integer maximum gives the same answer in any order of comparisons, so the
// two agree on every input, ties and NaN included.
//
// The key of element j holding v: the high 32 bits order the values (every
// float mapped, sign folded, onto unsigned integers in the order of the
// numbers), the low 32 bits are ~j, so among equal values the first index wins,
// as a loop that replaces its best only on a strictly larger value. -0 counts
// as +0 (they are equal numbers). A NaN ranks above every number, as in
// torch.argmax, and a row whose maximum is NaN never counts as a correct
// prediction: its answer is undefined, not a lucky guess.
#include <cstdint>

#include "runtime/core/half.h"

namespace mix::fn {

/// The rank of a float's value among all floats; NaN gets the highest.
/// Branch-free (selects only), so a CPU loop over a row vectorises.
MIX_HD uint32_t value_rank(float v) {
  uint32_t u = float_bits(v);
  u = u == 0x80000000u ? 0u : u;  // -0 == +0
  // Negative numbers: larger magnitude, smaller rank (all bits flipped); the
  // others: above every negative (sign bit set). +inf ends at 0xFF800000,
  // below the NaN rank.
  const uint32_t flip = static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? 0xFFFFFFFFu : u ^ flip;
}

/// The key of the element at `index` whose value has rank `rank`.
MIX_HD uint64_t rank_key(uint32_t rank, int64_t index) {
  return (static_cast<uint64_t>(rank) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(index));
}

MIX_HD uint64_t argmax_key(float v, int64_t index) { return rank_key(value_rank(v), index); }

/// Rows up to this many classes have an index that fits the key's low half.
inline constexpr int64_t kArgmaxMaxClasses = int64_t{0xFFFFFFFF};

/// The index the key stands for.
MIX_HD int64_t argmax_key_index(uint64_t key) { return 0xFFFFFFFFu - static_cast<uint32_t>(key & 0xFFFFFFFFu); }

/// True when the row's best key marks a correct prediction of `label`.
MIX_HD bool argmax_hits(uint64_t best_key, int64_t label) {
  return (best_key >> 32) != 0xFFFFFFFFu && argmax_key_index(best_key) == label;
}

}  // namespace mix::fn
