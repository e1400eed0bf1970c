#pragma once
// Gives every persistable variable of a program its first value (VarDesc::init),
// seeded by (seed, variable name) so the result does not depend on the order
// of creation or on the rank.
#include <cstdint>
#include <string>

#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"

namespace mix {

/// Creates each persistable variable absent from `scope`.
void initialize_persistables(const Program& p, Scope& scope, uint64_t seed);

}  // namespace mix
