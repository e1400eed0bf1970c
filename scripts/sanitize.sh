#!/usr/bin/env bash
# Builds the CPU code with AddressSanitizer and UndefinedBehaviorSanitizer
# into build-sanitize/ (or $MIX_BUILD_DIR) and runs the tests there; extra
# arguments go to ctest (default: -L unit, the unit tests; `-LE unit` runs the
# end-to-end and multi-rank ones, which take longer). Not part of
# scripts/test.sh: the instrumented build takes about 15 minutes on 2 cores.
# Any sanitizer report fails its test. Leak checking is off: Open MPI and
# OpenBLAS keep memory to the end on purpose.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=sanitize.sh
source "$root/scripts/lib/args.sh"  # usage_if_help
usage_if_help "$@" <<'EOF'
usage: scripts/sanitize.sh [CTEST ARGS...]
After scripts/setup.sh, builds the CPU code with AddressSanitizer and UndefinedBehaviorSanitizer and runs the
tests there; any sanitizer report fails its test (leak checking is off). About 15 minutes on 2 cores.
  CTEST ARGS       go to ctest (default: -L unit, the unit tests; -LE unit runs the end-to-end and multi-rank ones)
  MIX_BUILD_DIR    the build folder (default: build-sanitize/ of this checkout)
  ASAN_OPTIONS     appended to detect_leaks=0:abort_on_error=1 (default: nothing more)
  UBSAN_OPTIONS    appended to print_stacktrace=1:halt_on_error=1 (default: nothing more)
Only a first argument -h or --help is this script's; ctest's own help: ctest --help.
EOF
"$root/scripts/setup.sh"
build="${MIX_BUILD_DIR:-$root/build-sanitize}"
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMIX_WITH_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$build" -j "$(nproc)"
cd "$build"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
if [ $# -eq 0 ]; then set -- -L unit; fi
ctest --output-on-failure --timeout 1800 "$@"
