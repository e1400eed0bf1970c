#!/usr/bin/env bash
# Overlapped gradient sync against --no-overlap: the same AMP training step
# timed both ways, alternating, so that drift of a shared machine hits both.
# Prints the speed of each run (images/s; samples/s or tokens/s for the MLP
# and the Transformer), the medians, their ratio (overlap / no-overlap; >= 1
# means overlap is no slower), and the time blocked in c_allreduce_wait per
# step, which is the sync time backward did not hide. That time comes from one
# more run of each mode under MIX_PROFILE_OPS, kept apart from the timed runs:
# timing every op (on a GPU, events around each op, and no CUDA-graph replay)
# would change the speed being compared.
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
prog=bench_overlap.sh
source "$root/scripts/lib/args.sh"  # die, need_value, positive, usage_if_help
usage_if_help "$@" <<'EOF'
usage: scripts/bench_overlap.sh [-n RANKS] [--device cpu|cuda] [--model resnet-small]
                                [--batch-size 16] [--bucket-mb 0.1] [--steps 20] [--repeats 3]
Overlapped gradient sync against --no-overlap: the same AMP training step timed both ways, alternating.
Prints the speed of each run, the medians and their ratio (overlap / no-overlap; >= 1: overlap is no
slower), and the ms per step blocked in c_allreduce_wait (one more run of each under MIX_PROFILE_OPS).
  -n RANKS              ranks (default 2)
  --device cpu|cuda     (default cpu)
  --model NAME          (default resnet-small)
  --batch-size N        per rank (default 16)
  --bucket-mb MB        gradient bucket size (default 0.1: resnet-small's gradients are 0.35 MB in all)
  --steps N             timed steps of each run (default 20)
  --repeats N           runs of each mode (default 3)
  MIX_BUILD_DIR         mixrun and mixtrain (default: build/ of this checkout; scripts/build.sh when missing)
  OPENBLAS_NUM_THREADS  BLAS threads per rank (default 1)
EOF
while [ $# -gt 0 ]; do
  case "$1" in
    -n) need_value "$@"; positive "$1" "$2"; ranks="$2"; shift 2 ;;
    --device) need_value "$@"; device="$2"; shift 2 ;;
    --model) need_value "$@"; model="$2"; shift 2 ;;
    --batch-size) need_value "$@"; positive "$1" "$2"; batch="$2"; shift 2 ;;
    --bucket-mb) need_value "$@"; bucket_mb="$2"; shift 2 ;;
    --steps) need_value "$@"; positive "$1" "$2"; steps="$2"; shift 2 ;;
    --repeats) need_value "$@"; positive "$1" "$2"; repeats="$2"; shift 2 ;;
    -h | --help) usage ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -x "$build/mixtrain" ] || "$root/scripts/build.sh"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

train() {  # $1: log file, rest: extra flags
  local log="$1"; shift
  "$build/mixrun" -n "$ranks" -- "$build/mixtrain" --model "$model" --precision amp --device "$device" \
    --data synthetic --batch-size "$batch" --bucket-mb "$bucket_mb" --benchmark --steps "$steps" "$@" >"$log" 2>&1 || {
    cat "$log" >&2; echo "bench_overlap.sh: the run of $log failed" >&2; exit 1; }
}

# "benchmark: MODEL amp batch B x R ranks: RATE UNIT over ..." -> "RATE UNIT"
rate_of() { sed -n 's/^benchmark: .* ranks: \([0-9.e+-]*\) \([a-z]*\/s\) over .*/\1 \2/p' "$1"; }

timed() {  # $1: label, rest: extra flags; appends "label rate" to $tmp/results
  local label="$1"; shift
  train "$tmp/$label.log" "$@"
  local rate
  rate="$(rate_of "$tmp/$label.log")"
  [ -n "$rate" ] || { cat "$tmp/$label.log" >&2; echo "bench_overlap.sh: no benchmark line in the $label run" >&2; exit 1; }
  echo "$label ${rate% *}" >>"$tmp/results"
  printf '  %-11s %12s %s\n' "$label" "${rate% *}" "${rate#* }"
}

blocked() {  # $1: label, rest: extra flags; prints ms/step in c_allreduce_wait, from a profiled run
  local label="$1"; shift
  MIX_PROFILE_OPS=1 train "$tmp/$label.profile.log" "$@"
  local wait_ms
  wait_ms="$(sed -n 's/.*c_allreduce_wait *\([0-9.]*\) ms\/step.*/\1/p' "$tmp/$label.profile.log" | head -1)"
  echo "${wait_ms:-0}"  # no c_allreduce_wait op in the profile: nothing was waited for
}

echo "== $model, AMP, $ranks rank(s) on $device, batch $batch per rank, buckets of <= $bucket_mb MB, $steps timed steps"
for i in $(seq "$repeats"); do
  timed overlap
  timed no-overlap --no-overlap
done
echo "ms/step blocked in c_allreduce_wait (one run of each under MIX_PROFILE_OPS): overlap $(blocked overlap)," \
  "no-overlap $(blocked no-overlap --no-overlap)"
/usr/bin/python3 - "$tmp/results" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
med = {k: statistics.median(float(r[1]) for r in rows if r[0] == k) for k in ("overlap", "no-overlap")}
print(f"median speed: overlap {med['overlap']:.1f}, no-overlap {med['no-overlap']:.1f}, "
      f"ratio {med['overlap'] / med['no-overlap']:.3f} (>= 1: overlap is no slower)")
PY
