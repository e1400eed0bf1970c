#!/usr/bin/env bash
# Full convergence runs of ResNet-small (three stages of basic blocks, widths
# 16/32/64) on Fashion-MNIST, 2 ranks, batch 64 per rank, momentum SGD with a
# one-cycle schedule peaking at lr 0.1, weight decay 5e-4, 3 epochs: AMP (FP16
# all-reduce) and FP32. Prints each run's test accuracy and the AMP - FP32 gap.
# Takes about 25 minutes per run on a 2-core machine. The CI version is
# tests/e2e/test_resnet_convergence.py (shorter, with a bar it can meet there).
#
#   scripts/convergence.sh [--out DIR] [--epochs N] [--precisions "amp fp32"] [--report] [-- extra mixtrain flags]
# --report prints the figures of runs already in DIR without training.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MIX_BUILD_DIR:-$root/build}"
out="$root/runs/convergence"
epochs=3
precisions="amp fp32"
report_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --precisions) precisions="$2"; shift 2 ;;
    --report) report_only=1; shift ;;
    --) shift; break ;;
    *) echo "convergence.sh: unknown argument '$1' (see the header of this script)" >&2; exit 2 ;;
  esac
done
[ -x "$build/mixtrain" ] || "$root/scripts/build.sh"
mkdir -p "$out"
for p in $precisions; do
  [ "$report_only" = 1 ] && break
  echo "== resnet-small, $p, 2 ranks, $epochs epochs"
  start=$(date +%s)
  "$build/mixrun" -n 2 -- "$build/mixtrain" --model resnet-small --data fashion-mnist --precision "$p" \
    --epochs "$epochs" --batch-size 64 --optimizer momentum --momentum 0.9 --weight-decay 5e-4 \
    --lr 0.1 --lr-schedule onecycle --metrics "$out/$p.jsonl" --log-every 100 "$@"
  echo "$p wall time: $(( $(date +%s) - start )) s"
done
/usr/bin/python3 - "$out" $precisions <<'PY'
import json, sys, os
out, precisions = sys.argv[1], sys.argv[2:]
acc = {}
for p in precisions:
    lines = [json.loads(l) for l in open(os.path.join(out, p + ".jsonl"))]
    s = [l for l in lines if l.get("summary")][-1]
    acc[p] = 100 * s["eval_accuracy"]
    evals = [f"{100 * l['eval_accuracy']:.2f}" for l in lines if "eval_accuracy" in l and not l.get("summary")]
    print(f"{p:5s} test accuracy {acc[p]:.2f}%  (per epoch: {', '.join(evals)}; {s['skipped_steps']} skipped steps, "
          f"{s['samples_per_s_overall']:.0f} samples/s)")
if "amp" in acc and "fp32" in acc:
    print(f"AMP - FP32: {acc['amp'] - acc['fp32']:+.2f} points")
PY
