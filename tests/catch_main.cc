// main() of the unit tests: Catch2's, with the exit code of tests/skip_part.h.
//
// The console is 200 columns wide, wider than any test's name: Catch2 2.13
// wraps a failing test's name at the console width, and on some names (a
// hyphenated word where a line must break, at the default 80 columns) its
// wrapping prints lines of "-" without end, gigabytes a minute, or aborts, so
// a failure became a hang. test_catch_console runs such a name.
#define CATCH_CONFIG_CONSOLE_WIDTH 200
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "tests/skip_part.h"

int main(int argc, char** argv) {
  const int failed = Catch::Session().run(argc, argv);
  return mix::testing::exit_code(failed, !mix::testing::skipped_parts().empty());
}
