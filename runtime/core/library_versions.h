#pragma once
// The libraries this build was compiled against, as --version prints them.
// The code that uses each library registers its version from a static
// initialiser (the CUDA backend its CUDA and cuDNN, the NCCL communicator
// NCCL, ...), so a CPU-only build simply lists fewer, with no #ifdef here.
#include <string>
#include <utility>
#include <vector>

namespace mix {

/// Records that this build uses `library` at `version` (its headers'). Returns
/// true, so that a file can register with `static const bool x = register_...`.
bool register_library_version(const std::string& library, const std::string& version);

/// Every registered (library, version), sorted by library.
std::vector<std::pair<std::string, std::string>> library_versions();

}  // namespace mix
