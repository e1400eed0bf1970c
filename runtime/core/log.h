#pragma once
// Rank-aware logging on spdlog: every line starts with "[rank r/n]".
#include <spdlog/spdlog.h>

namespace mix::log {

/// Installs the "[rank r/n]" pattern. Rank 0 logs at info, other ranks at warn
/// unless MIX_LOG_ALL_RANKS=1, so that N ranks do not print N copies.
void init(int rank, int world);

}  // namespace mix::log
