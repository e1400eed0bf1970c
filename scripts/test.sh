#!/usr/bin/env bash
# The test command: set-up, build, then every test through CTest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build="${MIX_BUILD_DIR:-$root/build}"
cd "$build"
ctest --output-on-failure --timeout 900 "$@"
