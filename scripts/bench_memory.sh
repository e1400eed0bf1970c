#!/usr/bin/env bash
# Peak memory of one training step, FP32 against AMP, at equal batch on the CPU:
# the executor's plan of temporaries (activations, gradients, workspaces it
# allocates) and the caching allocator's peak, minus the persistent state
# (parameters, optimizer and scaler state). Prints one line per precision and
# the AMP / FP32 ratios (the ResNet issue's target: <= 0.6 for ResNet-50 at 224x224).
#
#   scripts/bench_memory.sh [--model resnet18|resnet34|resnet50|resnet-small] [--batch 8] [--image-size 224]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MIX_BUILD_DIR:-$root/build}"
model=resnet50
batch=8
size=224
prog=bench_memory.sh
source "$root/scripts/lib/args.sh"  # die, need_value, positive, usage_if_help
usage_if_help "$@" <<'EOF'
usage: scripts/bench_memory.sh [--model resnet18|resnet34|resnet50|resnet-small] [--batch 8] [--image-size 224]
Peak memory of one training step on the CPU, FP32 against AMP at equal batch: the executor's planned
temporaries and the allocator's peak minus the persistent state, one line per precision, and the AMP / FP32 ratios.
  --model NAME       a ResNet: resnet18, resnet34, resnet50 or resnet-small (default resnet50)
  --batch N          batch size, also the number of synthetic images (default 8)
  --image-size N     side of the synthetic images (default 224)
  MIX_BUILD_DIR      mixtrain (default: build/ of this checkout; scripts/build.sh when missing)
EOF
while [ $# -gt 0 ]; do
  case "$1" in
    --model) need_value "$@"; model="$2"; shift 2 ;;
    --batch) need_value "$@"; positive "$1" "$2"; batch="$2"; shift 2 ;;
    --image-size) need_value "$@"; positive "$1" "$2"; size="$2"; shift 2 ;;
    -h | --help) usage ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
# Synthetic images of --image-size: the comparison is the ResNets' (the MLP and
# the Transformer have no image size; --benchmark prints their peaks too).
case "$model" in
  resnet18 | resnet34 | resnet50 | resnet-small) ;;
  *) die "--model must be a ResNet (resnet18, resnet34, resnet50, resnet-small), got '$model'" ;;
esac
[ -x "$build/mixtrain" ] || "$root/scripts/build.sh"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for p in fp32 amp; do
  "$build/mixtrain" --model "$model" --data synthetic --image-size "$size" --synthetic-size "$batch" \
    --synthetic-classes 1000 --batch-size "$batch" --benchmark --benchmark-warmup 0 --steps 1 --precision "$p" \
    --eval false --metrics "$out/$p.jsonl" >/dev/null
done
/usr/bin/python3 - "$out" "$model" "$batch" "$size" <<'PY'
import json, sys
out, model, batch, size = sys.argv[1:]
s = {p: [json.loads(l) for l in open(f"{out}/{p}.jsonl")][-1] for p in ("fp32", "amp")}
mib = lambda b: b / 2**20
print(f"{model}, batch {batch}, {size}x{size}, one training step on the CPU")
print(f"{'':6s} {'planned temporaries':>20s} {'allocator peak':>15s} {'persistent':>11s} {'peak - persistent':>18s}")
for p in ("fp32", "amp"):
    x = s[p]
    print(f"{p:6s} {mib(x['planned_peak_temporary_bytes']):17.1f} MiB {mib(x['peak_bytes']):11.1f} MiB "
          f"{mib(x['persistent_bytes']):7.1f} MiB {mib(x['peak_bytes'] - x['persistent_bytes']):14.1f} MiB")
a, f = s["amp"], s["fp32"]
print(f"AMP / FP32: planned temporaries {a['planned_peak_temporary_bytes'] / f['planned_peak_temporary_bytes']:.3f}, "
      f"allocator peak minus persistent {(a['peak_bytes'] - a['persistent_bytes']) / (f['peak_bytes'] - f['persistent_bytes']):.3f}, "
      f"allocator peak {a['peak_bytes'] / f['peak_bytes']:.3f}")
PY
