// main() of the unit tests: Catch2's, with the exit code of tests/skip_part.h.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "tests/skip_part.h"

int main(int argc, char** argv) {
  const int failed = Catch::Session().run(argc, argv);
  return mix::testing::exit_code(failed, !mix::testing::skipped_parts().empty());
}
