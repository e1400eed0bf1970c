#pragma once
// FNV-1a, 64 bits: the one hash of fingerprints (models, configurations,
// masters) and of the seeds of per-variable and per-op random streams. Stable
// across runs, hosts and builds, which std::hash is not.
#include <cstddef>
#include <cstdint>
#include <string>

namespace mix {

inline constexpr uint64_t kFnv1aBasis = 0xcbf29ce484222325ull;

/// Hashes `bytes` bytes at `data`, continuing from `h` (chain calls to hash several pieces).
inline uint64_t fnv1a(const void* data, size_t bytes, uint64_t h = kFnv1aBasis) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}
inline uint64_t fnv1a(const std::string& s, uint64_t h = kFnv1aBasis) { return fnv1a(s.data(), s.size(), h); }

}  // namespace mix
