#!/usr/bin/env bash
# Fuzzes the readers of the files users hand to mixtrain (tests/fuzz/: one
# target per reader) with libFuzzer, under AddressSanitizer and
# UndefinedBehaviorSanitizer, from the seeds tests/fuzz/make_seeds.py writes.
# Not part of scripts/test.sh: a campaign runs for as long as it is given,
# and what it finds becomes a unit test of the reader it broke (docs/design.md,
# "Tests and oracles", lists them); the suite sweeps every target (fuzz.*).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=fuzz.sh
source "$root/scripts/lib/args.sh"  # die, need_value, positive, usage_if_help
usage_if_help "$@" <<'EOF2'
usage: scripts/fuzz.sh [--seconds N] [--jobs J] [TARGET...]
After scripts/setup.sh, builds the libFuzzer binaries of tests/fuzz/ with clang, ASan and UBSan, writes the
seeds, and fuzzes each TARGET (default: every target) for N seconds.
  --seconds N     each target's time (default 60)
  --jobs J        fuzzing processes per target (default 1)
  TARGET          a fuzz target: data_file, image_index, jpeg, png, resume, safetensors, tar_shards,
                  token_shards
  MIX_BUILD_DIR   the build folder (default: build-fuzz/ of this checkout)
The corpus of each target grows in BUILD/corpus/TARGET, so a later run goes on from it. An input that
breaks a target's contract (tests/fuzz/fuzz_target.h) is saved as BUILD/crashes/TARGET/crash-*, and the
script exits 1 naming it; rerun it with BUILD/tests/fuzz/fuzz_TARGET FILE, or sweep it with
BUILD/tests/fuzz/fuzz_sweep_TARGET FILE.
EOF2
seconds=60
jobs=1
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage ;;
    --seconds) need_value "$@"; positive "$1" "$2"; seconds=$2; shift 2 ;;
    --jobs) need_value "$@"; positive "$1" "$2"; jobs=$2; shift 2 ;;
    -*) die "unknown flag '$1' (see --help)" ;;
    *) [ -f "$root/tests/fuzz/fuzz_$1.cc" ] || die "no fuzz target '$1' (tests/fuzz/fuzz_$1.cc)"; targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$root"/tests/fuzz/fuzz_*.cc; do
    t=$(basename "$f" .cc)
    targets+=("${t#fuzz_}")
  done
fi
command -v clang++ >/dev/null || die "clang++ not found: apt-get install clang (libFuzzer comes with it)"

"$root/scripts/setup.sh"
build="${MIX_BUILD_DIR:-$root/build-fuzz}"
# fuzzer-no-link instruments every object for coverage; only the fuzz binaries link libFuzzer's main.
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMIX_WITH_CUDA=OFF \
  -DMIX_WITH_MPI=OFF -DMIX_FUZZ=ON -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]/#/fuzz_}" "${targets[@]/#/fuzz_sweep_}"
/usr/bin/python3 "$root/tests/fuzz/make_seeds.py" "$build/seeds"
for t in "${targets[@]}"; do  # and the seeds a target makes with mixtrain's own writers
  "$build/tests/fuzz/fuzz_sweep_$t" --write-seeds "$build/seeds/$t"
done

export ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export OPENBLAS_NUM_THREADS=1
failed=()
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t" crashes="$build/crashes/$t"
  mkdir -p "$corpus" "$crashes"
  echo "$prog: fuzzing $t for ${seconds} s"
  # -rss_limit_mb: an input that makes a reader allocate gigabytes is a find too.
  # With several jobs libFuzzer writes each one's log as fuzz-K.log in the working folder.
  parallel=()
  [ "$jobs" -eq 1 ] || parallel=(-jobs="$jobs" -workers="$jobs")
  if ! (cd "$build" && "$build/tests/fuzz/fuzz_$t" "$corpus" "$build/seeds/$t" -max_total_time="$seconds" \
      "${parallel[@]}" -rss_limit_mb=2048 -timeout=20 -artifact_prefix="$crashes/" -print_final_stats=1 \
      > "$build/fuzz-$t.log" 2>&1); then
    failed+=("$t")
    echo "$prog: $t broke its contract; log $build/fuzz-$t.log, inputs:" $(ls "$crashes")
  fi
  grep -h "stat::number_of_executed_units\|stat::new_units_added" "$build/fuzz-$t.log" | sed "s/^/  $t /" || true
done
[ ${#failed[@]} -eq 0 ] || { echo "$prog: failed: ${failed[*]}"; exit 1; }
echo "$prog: every target held its contract"
