#pragma once
// Catch2 2.x has no SKIP. A test part that needs what this machine lacks (a
// GPU, the F16C instructions, an installed data set) calls skip_part(why) and
// returns; when the run ends with no failure, exit_code() turns "some part
// was skipped" into exit 77, which CTest reports as skipped, never as passed.
// A failure anywhere still wins: the parts that did run can always fail.
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <vector>

namespace mix::testing {

inline std::vector<std::string>& skipped_parts() {
  static std::vector<std::string> parts;
  return parts;
}

/// Records that a part of this run could not be tested here, and why.
inline void skip_part(const std::string& why) {
  WARN("SKIP: " << why);
  skipped_parts().push_back(why);
}

inline constexpr int kSkipExitCode = 77;

/// The process's exit code from Catch's failure count: 1 when anything failed
/// (Catch's own count could be 77 and read as a skip), 77 when a part was
/// skipped, 0 otherwise. The reasons are printed for the log.
inline int exit_code(int failed, bool any_skipped) {
  if (failed != 0) return 1;
  if (!any_skipped) return 0;
  for (const auto& why : skipped_parts()) std::printf("SKIP: %s\n", why.c_str());
  return kSkipExitCode;
}

}  // namespace mix::testing
