#!/usr/bin/env bash
# Builds the CPU code with AddressSanitizer and UndefinedBehaviorSanitizer
# into build-sanitize/ (or $MIX_BUILD_DIR) and runs the tests there; extra
# arguments go to ctest (default: -L 'unit|fuzz', the unit tests, the emulated
# CUDA kernels among them, and the file readers' fuzz sweeps; -L 'mpi|e2e'
# runs the end-to-end and multi-rank ones, which take longer). Not part of
# scripts/test.sh: the instrumented build is long (docs/design.md, "Tests and
# oracles", gives its measured time). Any sanitizer report fails its test.
# Leak checking is off: Open MPI and OpenBLAS keep memory to the end on purpose.
#
# --thread: ThreadSanitizer instead, into build-tsan/, over the tests of the
# code that starts threads of its own (the data readers' worker pool and
# prefetcher) and of the stop signals' handler (TSan also reports calls that
# are unsafe in a signal handler), unless ctest arguments choose others;
# only those tests' targets are built then.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=sanitize.sh
source "$root/scripts/lib/args.sh"  # usage_if_help
usage_if_help "$@" <<'EOF'
usage: scripts/sanitize.sh [--thread] [CTEST ARGS...]
After scripts/setup.sh, builds the CPU code with AddressSanitizer and UndefinedBehaviorSanitizer and runs the
tests there; any sanitizer report fails its test (leak checking is off). Long: docs/design.md gives its time.
  --thread         ThreadSanitizer instead (build-tsan/): by default only the data readers' threads and the stop
                   signals' handler (unit.test_data, unit.test_image_folder, unit.test_stop_signals), only their
                   targets built
  CTEST ARGS       go to ctest (default: -L 'unit|fuzz', the unit tests and the file readers' fuzz sweeps;
                   -L 'mpi|e2e' runs the end-to-end and multi-rank ones)
  MIX_BUILD_DIR    the build folder (default: build-sanitize/, or build-tsan/ with --thread, of this checkout)
  ASAN_OPTIONS     appended to detect_leaks=0:abort_on_error=1 (default: nothing more)
  UBSAN_OPTIONS    appended to print_stacktrace=1:halt_on_error=1 (default: nothing more)
  TSAN_OPTIONS     appended to halt_on_error=1:second_deadlock_stack=1 (default: nothing more)
Only a first argument -h or --help is this script's; ctest's own help: ctest --help.
EOF
sanitizer=address
if [ "${1:-}" = --thread ]; then
  sanitizer=thread
  shift
fi
"$root/scripts/setup.sh"
export OPENBLAS_NUM_THREADS=1  # OpenBLAS's own threads are not instrumented; the tests need none
targets=()  # cmake --build's targets: all of them unless --thread picks its tests' own
if [ "$sanitizer" = thread ]; then
  build="${MIX_BUILD_DIR:-$root/build-tsan}"
  flags="-fsanitize=thread -fno-omit-frame-pointer"
  link_flags="-fsanitize=thread"
  if [ $# -eq 0 ]; then
    targets=(--target test_data test_image_folder test_stop_signals)
    set -- -R '^unit\.(test_data|test_image_folder|test_stop_signals)$'
  fi
else
  build="${MIX_BUILD_DIR:-$root/build-sanitize}"
  flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
  link_flags="-fsanitize=address,undefined"
  if [ $# -eq 0 ]; then set -- -L 'unit|fuzz'; fi
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMIX_WITH_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$link_flags" >/dev/null
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
cd "$build"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
ctest --output-on-failure --timeout 1800 "$@"
