#pragma once
// Gives every persistable variable of a program its first value (VarDesc::init),
// seeded by (seed, variable name) so the result does not depend on the order
// of creation or on the rank.
#include <cstdint>
#include <string>

#include "runtime/op_registry.h"
#include "runtime/program.h"

namespace mix {

/// Creates each persistable variable absent from `scope`.
void initialize_persistables(const Program& p, Scope& scope, uint64_t seed);

/// FNV-1a 64-bit hash (fingerprints and seeding streams).
uint64_t fnv1a(const void* data, size_t bytes, uint64_t h = 0xcbf29ce484222325ull);
inline uint64_t fnv1a(const std::string& s, uint64_t h = 0xcbf29ce484222325ull) { return fnv1a(s.data(), s.size(), h); }

}  // namespace mix
