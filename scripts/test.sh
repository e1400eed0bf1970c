#!/usr/bin/env bash
# The test command: set-up, build, then every test through CTest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=test.sh
source "$root/scripts/lib/args.sh"  # usage_if_help
usage_if_help "$@" <<'EOF'
usage: scripts/test.sh [CTEST ARGS...]
The test command: scripts/setup.sh --tests, scripts/build.sh, then every test through CTest
(ctest --output-on-failure --timeout 900) in the build folder.
  CTEST ARGS       go to ctest, e.g. -L unit, -LE unit, -R e2e.layers, -j 2
  MIX_BUILD_DIR    the build folder (default: build/ of this checkout)
  MIX_CMAKE_ARGS   as in scripts/build.sh --help
  MIX_LONG_TESTS   1: also run the long tests (label long, e.g. e2e.test_image_accuracy, about 10
                   minutes); otherwise they report skipped
Only a first argument -h or --help is this script's; ctest's own help: ctest --help.
EOF
"$root/scripts/setup.sh" --tests
"$root/scripts/build.sh"
build="${MIX_BUILD_DIR:-$root/build}"
cd "$build"
ctest --output-on-failure --timeout 900 "$@"
