// One fuzz target: a reader of files users hand to mixtrain, fed bytes as if
// they were such a file. Two drivers run the targets: libFuzzer
// (libfuzzer_main.cc, a clang build with -DMIX_FUZZ=ON, scripts/fuzz.sh), and
// the sweep (sweep_main.cc, every build, a CTest test per target) that runs
// fixed mutations of seed files.
//
// The contract each target checks: the reader either accepts the bytes or
// refuses them with mix::Error whose message names the file. Anything else
// is a bug the drivers report: another exception (std::length_error,
// std::invalid_argument: a user would read "basic_string::_M_create"), a
// crash, a sanitizer's report, or a hang.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mix::fuzz {

/// The target's name, as its CTest test and its seed folder are named.
extern const char* const kTargetName;

enum class Outcome { accepted, refused };

/// Feeds `bytes` to the target's reader and says whether it accepted them or
/// refused them as the contract says; throws ContractBroken (or lets any
/// other exception out) when it did neither.
Outcome run_one(const std::string& bytes);

/// Seeds (name, bytes) that the target makes with mixtrain's own writers
/// (a checkpoint as --save writes it). Optional: a target that defines none
/// takes its seeds from make_seeds.py's files alone.
std::vector<std::pair<std::string, std::string>> own_seeds() __attribute__((weak));

}  // namespace mix::fuzz
