#pragma once
// Dropout's mask, written once for host and device (MIX_HD). Element i of a
// dropout op is kept iff uniform(key, i) >= p, where uniform hashes (key, i)
// statelessly: any thread can compute any element's bit on its own, so the
// CUDA kernel needs no RNG state and produces the CPU's mask bit for bit.
//
// The key identifies one dropout op in one step of one rank (dropout_key): the
// attr seed, the optimizer step, the rank and a hash of the op's output name,
// so two dropout ops, two steps or two ranks draw unrelated masks, and a rerun
// of the same step (a finite-difference check, a resumed run) draws the same.
#include <cstdint>

#include "runtime/core/half.h"

namespace mix::fn {

/// splitmix64's finaliser (Steele, Lea, Flood 2014), the same as Rng::mix64.
MIX_HD uint64_t dropout_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// The key of one dropout op: each field is folded in through the mixer, so
/// keys of nearby (seed, step, rank) share no structure.
MIX_HD uint64_t dropout_key(uint64_t seed, uint64_t step, uint64_t rank, uint64_t name_hash) {
  uint64_t k = dropout_mix64(seed ^ 0x6a09e667f3bcc908ull);
  k = dropout_mix64(k ^ step);
  k = dropout_mix64(k ^ (rank + 0x3c6ef372fe94f82bull));
  return dropout_mix64(k ^ name_hash);
}

/// Uniform in [0, 1) with 24 random bits (exact in float): the index-th output
/// of a splitmix64 stream started at `key`.
MIX_HD float dropout_uniform(uint64_t key, uint64_t index) {
  const uint64_t z = dropout_mix64(key + (index + 1) * 0x9e3779b97f4a7c15ull);
  return static_cast<float>(z >> 40) * 0x1.0p-24f;
}

/// Whether element `index` survives dropout with probability p of dropping.
/// P(keep) = 1 - p up to the 2^-24 grid (p = 0 keeps everything).
MIX_HD bool dropout_keep(uint64_t key, uint64_t index, float p) { return dropout_uniform(key, index) >= p; }

/// upscale_in_train: out = x * mask * scale, scale = 1 / (1 - p), taken once in
/// float on the host. The grad is the same map applied to dOut.
struct DropoutApply {
  float scale;
  MIX_HD float operator()(float x, uint8_t keep) const { return keep ? x * scale : 0.f; }
};

/// The scale of kept elements for a drop probability p in [0, 1).
MIX_HD float dropout_scale(float p) { return 1.f / (1.f - p); }

}  // namespace mix::fn
