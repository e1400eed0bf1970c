#!/usr/bin/env bash
# FP16 against FP32 gradient sync, in numbers and pictures. Runs, through mixrun:
#   1. mixbench allreduce over half and float, -b 1K to --max-bytes by 2, checked
#      against exact values, into DIR/allreduce.csv;
#   2. mixbench grad-sync for each model with FP16 and with FP32 all-reduce (AMP
#      programs, buckets as in training), into DIR/grad_sync.csv;
# then scripts/plot_bandwidth.py prints the FP16/FP32 time ratios (a row without
# one says why: "no fp32 run", "fp32 time is 0") and renders DIR/allreduce_busbw.png
# and DIR/grad_sync.png, the sync times on a log axis (Debian's python3-matplotlib).
#
#   scripts/bandwidth.sh [-n RANKS] [--device cpu|cuda] [--hosts h1:k,h2:k] [--out DIR]
#                        [--max-bytes 256M] [--models "mlp resnet50 transformer"] [--iters N]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MIX_BUILD_DIR:-$root/build}"
ranks=2
device=cpu
hosts=""
out="$root/runs/bandwidth"
max_bytes=256M
models="mlp resnet50 transformer"
iters=20
prog=bandwidth.sh
source "$root/scripts/lib/args.sh"  # die, need_value, positive, usage_if_help
usage_if_help "$@" <<'EOF'
usage: scripts/bandwidth.sh [-n RANKS] [--device cpu|cuda] [--hosts h1:k,h2:k] [--out DIR]
                            [--max-bytes 256M] [--models "mlp resnet50 transformer"] [--iters N]
FP16 against FP32 gradient sync, through mixrun: mixbench allreduce (half, float) into DIR/allreduce.csv
and mixbench grad-sync per model (FP16, FP32 all-reduce) into DIR/grad_sync.csv; then
scripts/plot_bandwidth.py prints the FP16/FP32 ratios (a row without one says why) and renders
DIR/allreduce_busbw.png and DIR/grad_sync.png (time per sync per model on a log axis).
  -n RANKS              ranks (default 2)
  --device cpu|cuda     (default cpu)
  --hosts h1:k,h2:k     mixrun's --hosts (default: none, this machine)
  --out DIR             (default: runs/bandwidth of this checkout)
  --max-bytes SIZE      the largest all-reduce; the sweep goes from 1K by 2 (default 256M)
  --models "LIST"       the grad-sync models (default "mlp resnet50 transformer")
  --iters N             timed iterations of each size and model (default 20)
  MIX_BUILD_DIR         mixrun and mixbench (default: build/ of this checkout; scripts/build.sh when missing)
  OPENBLAS_NUM_THREADS  BLAS threads per rank (default 1)
EOF
while [ $# -gt 0 ]; do
  case "$1" in
    -n) need_value "$@"; positive "$1" "$2"; ranks="$2"; shift 2 ;;
    --device) need_value "$@"; device="$2"; shift 2 ;;
    --hosts) need_value "$@"; hosts="$2"; shift 2 ;;
    --out) need_value "$@"; out="$2"; shift 2 ;;
    --max-bytes) need_value "$@"; max_bytes="$2"; shift 2 ;;
    --models) need_value "$@"; models="$2"; shift 2 ;;
    --iters) need_value "$@"; positive "$1" "$2"; iters="$2"; shift 2 ;;
    -h | --help) usage ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
# Checked before the sweep, which runs for minutes: the sweep starts at 1K,
# and each model must be one mixbench grad-sync knows.
[[ $max_bytes =~ ^([0-9]+)([KkMmGg]?)$ ]] || die "--max-bytes takes a size such as 4096, 64K, 256M or 1G, got '$max_bytes'"
case "${BASH_REMATCH[2]}" in [Kk]) scale=1024 ;; [Mm]) scale=$((1024 * 1024)) ;; [Gg]) scale=$((1024 * 1024 * 1024)) ;; *) scale=1 ;; esac
[ $((10#${BASH_REMATCH[1]} * scale)) -ge 1024 ] || die "--max-bytes $max_bytes is below 1K, where the all-reduce sweep starts"
for m in $models; do
  case "$m" in
    mlp | resnet18 | resnet34 | resnet50 | resnet-small | transformer) ;;
    *) die "--models: unknown model '$m' (mlp, resnet18, resnet34, resnet50, resnet-small, transformer)" ;;
  esac
done
[ -x "$build/mixbench" ] || "$root/scripts/build.sh"
mkdir -p "$out"
launch=("$build/mixrun" -n "$ranks")
[ -n "$hosts" ] && launch+=(--hosts "$hosts")
# On a shared CPU, one BLAS thread per rank (mixrun passes the environment on).
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"

echo "== all-reduce, half and float, $ranks ranks, $device"
"${launch[@]}" -- "$build/mixbench" allreduce -b 1K -e "$max_bytes" -f 2 -d half,float -o sum -n "$iters" -w 5 \
  --check --device "$device" --csv "$out/allreduce.csv"
rm -f "$out/grad_sync.csv"
for m in $models; do
  for reduce in fp16 fp32; do
    echo "== gradient sync: $m, AMP, all-reduce in $reduce"
    "${launch[@]}" -- "$build/mixbench" grad-sync --model "$m" --precision amp --grad-reduce "$reduce" \
      -n "$iters" -w 5 --device "$device" --csv "$out/grad_sync.csv"
  done
done
echo
/usr/bin/python3 "$root/scripts/plot_bandwidth.py" "$out"
