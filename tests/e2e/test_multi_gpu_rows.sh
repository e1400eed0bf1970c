#!/usr/bin/env bash
# The several-GPU rows of scripts/gpu_check.sh, on the CPU with 2 ranks, through
# the GPU bundle's own launcher (what a multi-GPU lend will run, with tiny sizes):
#   1. scripts/gpu_bundle.sh writes a bundle; its deps/openmpi/bin/mpirun starts
#      2 ranks from a bare environment (env -i: no LD_LIBRARY_PATH, no OPAL_*),
#      the launcher maps Open MPI's libraries and plugins from the bundle only,
#      and the ranks' loader resolves libmpi and its libraries into the bundle.
#   2. gpu_check.sh --multi-rank-cpu 2 --bundle DIR runs the rows with this
#      build's mixtrain, mixbench and mixrun (MIX_BUILD_DIR) and exits 0; every
#      summary line has numbers, no n/a, and every run exited 0.
# Exits 77 (skipped) where no bundle can be written (not a git checkout, not a
# Debian machine with the -dev and Open MPI packages) or the build has no MPI.
# Takes about a minute on the 2-core CI machine.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${MIX_BUILD_DIR:-$root/build}"
if ! git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1 || ! command -v dpkg >/dev/null 2>&1 \
   || ! dpkg -s libspdlog-dev openmpi-bin >/dev/null 2>&1; then
  echo "SKIP: not a git checkout on a machine with the Debian -dev and Open MPI packages; no bundle to write"
  exit 77
fi
if [ "${MIX_WITH_MPI:-ON}" = OFF ]; then
  echo "SKIP: this build has no MPI (MIX_WITH_MPI=OFF): no several-rank runs"
  exit 77
fi
for p in mixtrain mixbench mixrun; do
  [ -x "$build/$p" ] || { echo "FAIL: $build/$p is not built"; exit 1; }
done
t_start=$(date +%s)
tmp="$(mktemp -d "${TMPDIR:-/tmp}/mix_multi_rows.XXXXXX")"
cleanup() { if [ -n "${MIX_KEEP_MULTI_TEST:-}" ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi; }
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
step() { echo "== $* ($(( $(date +%s) - t_start )) s)"; }

step "writing the bundle"
bundle="$tmp/bundle"
"$root/scripts/gpu_bundle.sh" "$bundle" | tail -1
launcher="$bundle/deps/openmpi/bin/mpirun"
[ -x "$launcher" ] || { echo "FAIL: the bundle has no $launcher"; exit 1; }
echo "bundle: $(du -sb "$bundle" | cut -f1) bytes, of which Open MPI $(du -sb "$bundle/deps/openmpi" | cut -f1) + its libraries in deps/lib"

# ---- 1. the bundled launcher alone ---------------------------------------------------
step "2 ranks from the bundle's launcher in a bare environment"
bare=(env -i PATH=/usr/bin:/bin HOME="${HOME:-/root}" OPENBLAS_NUM_THREADS=1)
root_flag=()
[ "$(id -u)" -eq 0 ] && root_flag=(--allow-run-as-root)
# Each rank prints its rank, the launcher's mapped shared objects (its parent:
# orterun forks the ranks itself) and where its loader finds libmpi.
if ! "${bare[@]}" "$launcher" "${root_flag[@]}" -n 2 --oversubscribe --bind-to none bash -c \
     'echo "rank $OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE"; grep -o "/[^ ]*\.so[^ ]*" /proc/$PPID/maps | sort -u | sed "s/^/launcher maps /";
      LD_TRACE_LOADED_OBJECTS=1 "$0" | sed "s/^/rank loads /"' "$build/mixtrain" >"$tmp/bare.log" 2>&1; then
  cat "$tmp/bare.log"; fail "the bundle's mpirun could not start 2 ranks"
fi
[ "$(grep -c '^rank [01] of 2$' "$tmp/bare.log")" -eq 2 ] || { cat "$tmp/bare.log"; fail "not 2 ranks of a world of 2"; }
grep -q "^launcher maps $bundle/deps/openmpi/lib/openmpi3/mca_plm_isolated.so" "$tmp/bare.log" ||
  fail "the launcher did not load its plugins from the bundle"
if grep "^launcher maps " "$tmp/bare.log" | grep -E "openmpi|libopen-(pal|rte)|libpmix|libhwloc|libevent" | grep -v "$bundle/"; then
  fail "the launcher mapped Open MPI files from outside the bundle (above)"
fi
for lib in libmpi.so.40 libopen-pal.so.40 libopen-rte.so.40 libhwloc.so.15; do
  where=$(awk -v n="$lib" '$3 == n {print $5; exit}' "$tmp/bare.log")
  echo "  ranks: $lib => $where"
  [[ "$where" == "$bundle/deps/lib/"* ]] || fail "the ranks load $lib from '$where', not from the bundle"
done

# ---- 2. the rows ----------------------------------------------------------------------
step "gpu_check.sh --multi-rank-cpu 2 --bundle"
out="$tmp/out"
rc=0
env -u MIX_MPIRUN MIX_BUILD_DIR="$build" OPENBLAS_NUM_THREADS=1 \
  "$root/scripts/gpu_check.sh" --multi-rank-cpu 2 --bundle "$bundle" --out "$out" >"$tmp/rows.log" 2>&1 || rc=$?
cat "$tmp/rows.log"
[ "$rc" -eq 0 ] || fail "gpu_check.sh --multi-rank-cpu 2 exited $rc"
grep -q "through $launcher " "$tmp/rows.log" || fail "the rows did not start through the bundle's launcher"
summary="$out/summary.txt"
[ -f "$summary" ] || { echo "FAIL: no $summary"; exit 1; }
num='[0-9]+(\.[0-9]+)?'
expect() {  # label (fixed string), regex the rest of the line must match
  local line
  line=$(grep -F -- "$1" "$summary" | head -1)
  if [ -z "$line" ]; then fail "no summary line '$1'"; return; fi
  [[ "${line#*"$1"}" =~ $2 ]] || fail "summary line '$line' does not match $2"
}
expect "allreduce MPI busbw GB/s half / float" "^ +$num / $num at 1048576 B, Out of bounds values : 0 OK \(exit 0\)$"
for model in resnet50 transformer; do
  for reduce in fp16 fp32; do
    expect "grad-sync $model $reduce ms, GB/s" "^ +$num, $num \(exit 0\)$"
  done
done
expect "ResNet-50 AMP img/s 1 / 2 CPU ranks" "^ +$num / $num \(exit 0 / 0\)$"
expect "ResNet-50 AMP scaling efficiency" "^ +$num$"
expect "Transformer AMP tok/s 1 / 2 CPU ranks" "^ +$num / $num \(exit 0 / 0\)$"
expect "Transformer AMP scaling efficiency" "^ +$num$"
expect "ResNet-50 AMP step ms, overlap / not" "^ +$num / $num \(exit 0 / 0\)$"
expect "no-overlap / overlap step time" "^ +$num$"
expect "ResNet-50 AMP --cuda-graph img/s" "^ +$num \(exit 0\)"
if grep -q "grad-sync gpt2 fp16" "$summary"; then  # once the build has --model gpt2
  expect "grad-sync gpt2 fp16 ms, GB/s" "^ +$num, $num \(exit 0\)$"
  expect "GPT-2 AMP scaling efficiency" "^ +$num$"
fi
grep -n "n/a" "$summary" && fail "the summary has n/a (above)"
# The N-rank runs really ran on 2 ranks.
grep -q '"world_size":2' "$out/multi_resnet50_n.jsonl" || fail "the 2-rank ResNet-50 run's summary lacks world_size 2"

step "done"
if [ "$failures" -gt 0 ]; then
  echo "FAIL: $failures check(s) failed"
  exit 1
fi
echo "PASS: the several-GPU rows run on 2 CPU ranks through the bundle's Open MPI"
