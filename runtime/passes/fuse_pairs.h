#pragma once
// The machinery the producer-consumer fusion passes share
// (runtime/passes/fuse_add_relu.h, runtime/passes/fuse_bn_relu.h): find a producer whose
// output has one reader, the consumer, and replace the two with one fused op
// at the consumer's place.
#include <functional>
#include <optional>
#include <set>
#include <string>

#include "runtime/ir/program.h"

namespace mix {

/// Builds the fused op for a producer and its consumer (which reads the
/// producer's output through `slot`), or returns nothing where the pair does
/// not fit.
using MakeFused =
    std::function<std::optional<OpDesc>(const OpDesc& producer, const OpDesc& consumer, const std::string& slot)>;

/// Replaces each op of `producer_type` whose output `out_slot` (t) has exactly
/// one writer and one later reader, the consumer, with `make_fused`'s op at
/// the consumer's place, when t is neither persistable nor in `keep`, the
/// consumer reads t through a slot holding t alone, and nothing but
/// collective ops lies between the two (the fused op runs where the consumer
/// ran, so the producer's inputs must still hold their values there; see
/// fuse_pairs.cc). The fused op takes the consumer's role. Returns how many
/// pairs it fused; t stays declared, unused.
int fuse_pairs(Program& p, const std::set<std::string>& keep, const std::string& producer_type,
               const std::string& out_slot, const MakeFused& make_fused);

}  // namespace mix
