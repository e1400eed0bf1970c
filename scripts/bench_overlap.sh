#!/usr/bin/env bash
# Overlapped gradient sync against --no-overlap: the same AMP training step
# timed both ways, alternating, so that drift of a shared machine hits both.
# Prints images/s per run, the medians, their ratio (overlap / no-overlap;
# >= 1 means overlap is no slower), and the time blocked in c_allreduce_wait
# per step (MIX_PROFILE_OPS), which is the sync time backward did not hide.
#
#   scripts/bench_overlap.sh [-n RANKS] [--device cpu|cuda] [--model resnet-small]
#                            [--batch-size 16] [--bucket-mb 0.1] [--steps 20] [--repeats 3]
#
# The default buckets are small (0.1 MB) because resnet-small's gradients are
# 0.35 MB in all: at DDP's 25 MB they would make one bucket, which can only
# start when backward is over, and there would be nothing to compare.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MIX_BUILD_DIR:-$root/build}"
ranks=2
device=cpu
model=resnet-small
batch=16
bucket_mb=0.1
steps=20
repeats=3
while [ $# -gt 0 ]; do
  case "$1" in
    -n) ranks="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --batch-size) batch="$2"; shift 2 ;;
    --bucket-mb) bucket_mb="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    *) echo "bench_overlap.sh: unknown argument '$1' (see the header of this script)" >&2; exit 2 ;;
  esac
done
[ -x "$build/mixtrain" ] || "$root/scripts/build.sh"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
export MIX_PROFILE_OPS=1
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

run() {  # $1: label, rest: extra flags; appends "label images/s wait_ms" to $tmp/results
  local label="$1"; shift
  local log="$tmp/$label.log"
  "$build/mixrun" -n "$ranks" -- "$build/mixtrain" --model "$model" --precision amp --device "$device" \
    --data synthetic --batch-size "$batch" --bucket-mb "$bucket_mb" --benchmark --steps "$steps" "$@" >"$log" 2>&1 || {
    cat "$log" >&2; echo "bench_overlap.sh: the $label run failed" >&2; exit 1; }
  local ips wait_ms
  ips="$(sed -n 's/^benchmark: .*: \([0-9.]*\) images\/s.*/\1/p' "$log")"
  wait_ms="$(sed -n 's/.*c_allreduce_wait *\([0-9.]*\) ms\/step.*/\1/p' "$log" | head -1)"
  echo "$label ${ips:-nan} ${wait_ms:-nan}" >>"$tmp/results"
  printf '  %-11s %10s images/s   %8s ms/step blocked in c_allreduce_wait\n' "$label" "$ips" "$wait_ms"
}

echo "== $model, AMP, $ranks rank(s) on $device, batch $batch per rank, buckets of <= $bucket_mb MB, $steps timed steps"
for i in $(seq "$repeats"); do
  run overlap
  run no-overlap --no-overlap
done
/usr/bin/python3 - "$tmp/results" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
med = {k: statistics.median(float(r[1]) for r in rows if r[0] == k) for k in ("overlap", "no-overlap")}
wait = {k: statistics.median(float(r[2]) for r in rows if r[0] == k) for k in ("overlap", "no-overlap")}
print(f"median images/s: overlap {med['overlap']:.1f}, no-overlap {med['no-overlap']:.1f}, "
      f"ratio {med['overlap'] / med['no-overlap']:.3f} (>= 1: overlap is no slower)")
print(f"median ms/step blocked in c_allreduce_wait: overlap {wait['overlap']:.2f}, "
      f"no-overlap {wait['no-overlap']:.2f}")
PY
