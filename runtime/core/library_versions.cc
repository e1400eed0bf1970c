#include "runtime/core/library_versions.h"

#include <algorithm>
#include <mutex>

namespace mix {

namespace {
// Function-local statics: registrations run from other files' static
// initialisers, in no fixed order.
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::pair<std::string, std::string>>& registry() {
  static std::vector<std::pair<std::string, std::string>> r;
  return r;
}
}  // namespace

bool register_library_version(const std::string& library, const std::string& version) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().emplace_back(library, version);
  return true;
}

std::vector<std::pair<std::string, std::string>> library_versions() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::pair<std::string, std::string>> r = registry();
  std::sort(r.begin(), r.end());
  return r;
}

}  // namespace mix
