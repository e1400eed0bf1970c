#!/usr/bin/env bash
# Full convergence runs, AMP (FP16 all-reduce) against FP32, on 2 ranks.
#
# --model resnet-small (the default): three stages of basic blocks, widths
#   16/32/64, on Fashion-MNIST, batch 64 per rank, momentum SGD with a one-cycle
#   schedule peaking at lr 0.1, weight decay 5e-4, 3 epochs. Prints each run's
#   test accuracy and the AMP - FP32 gap. About 6 minutes per run on 2 cores
#   (docs/models.md has the figures).
# --model transformer: 4 layers, d_model 128, 4 heads, context 128, byte-level
#   on Debian's fortunes text, 16 sequences per rank, AdamW (lr 2e-3, weight
#   decay 0.1) with 100 warm-up steps and a cosine schedule, 1500 steps,
#   evaluated every 250. Prints each run's validation loss (nats per byte) and
#   AMP's relative gap to FP32. Target: AMP < 2.0 nats/byte, within 2 % of FP32.
#
# The CI versions are tests/e2e/test_resnet_convergence.py and
# tests/e2e/test_transformer_convergence.py (shorter, with bars they can meet there).
#
#   scripts/convergence.sh [--model resnet-small|transformer] [--out DIR] [--epochs N] [--steps N]
#                          [--precisions "amp fp32"] [--report] [-- extra mixtrain flags]
# --report prints the figures of runs already in DIR without training.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MIX_BUILD_DIR:-$root/build}"
model=resnet-small
out=""
epochs=3
steps=1500
precisions="amp fp32"
report_only=0
prog=convergence.sh
source "$root/scripts/lib/args.sh"  # die, usage_if_help
usage_if_help "$@" <<'EOF'
usage: scripts/convergence.sh [--model resnet-small|transformer] [--out DIR] [--epochs N] [--steps N]
                              [--precisions "amp fp32"] [--report] [-- extra mixtrain flags]
Full convergence runs, AMP (FP16 all-reduce) against FP32, on 2 ranks: resnet-small on Fashion-MNIST
(test accuracy, AMP - FP32 gap) or a 4-layer Transformer on fortunes (validation loss, AMP's relative gap).
  --model NAME        resnet-small or transformer (default resnet-small)
  --out DIR           (default: runs/convergence, or runs/convergence_transformer, of this checkout)
  --epochs N          resnet-small's epochs (default 3)
  --steps N           the Transformer's steps (default 1500)
  --precisions "..."  the runs, in order (default "amp fp32")
  --report            print the figures of the runs already in DIR, without training
  -- FLAGS            the rest go to every mixtrain run (build/mixtrain --help lists them)
  MIX_BUILD_DIR       mixrun and mixtrain (default: build/ of this checkout; scripts/build.sh when missing)
EOF
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --precisions) precisions="$2"; shift 2 ;;
    --report) report_only=1; shift ;;
    --) shift; break ;;
    -h | --help) usage ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
case "$model" in
  resnet-small) out="${out:-$root/runs/convergence}" ;;
  transformer) out="${out:-$root/runs/convergence_transformer}" ;;
  *) echo "convergence.sh: --model is resnet-small or transformer, not '$model'" >&2; exit 2 ;;
esac
[ -x "$build/mixtrain" ] || "$root/scripts/build.sh"
mkdir -p "$out"
for p in $precisions; do
  [ "$report_only" = 1 ] && break
  start=$(date +%s)
  if [ "$model" = transformer ]; then
    echo "== transformer (4 x 128, context 128), fortunes, $p, 2 ranks, $steps steps"
    "$build/mixrun" -n 2 -- "$build/mixtrain" --model transformer --layers 4 --d-model 128 --heads 4 \
      --context 128 --data fortunes --precision "$p" --steps "$steps" --batch-size 16 --optimizer adamw \
      --lr 2e-3 --weight-decay 0.1 --lr-schedule cosine --warmup-steps 100 --eval-every 250 \
      --metrics "$out/$p.jsonl" --log-every 50 "$@"
  else
    echo "== resnet-small, $p, 2 ranks, $epochs epochs"
    "$build/mixrun" -n 2 -- "$build/mixtrain" --model resnet-small --data fashion-mnist --precision "$p" \
      --epochs "$epochs" --batch-size 64 --optimizer momentum --weight-decay 5e-4 \
      --lr 0.1 --lr-schedule onecycle --metrics "$out/$p.jsonl" --log-every 100 "$@"
  fi
  echo "$p wall time: $(( $(date +%s) - start )) s"
done
/usr/bin/python3 - "$out" "$model" $precisions <<'PY'
import json, sys, os
out, model, precisions = sys.argv[1], sys.argv[2], sys.argv[3:]
final = {}
for p in precisions:
    lines = [json.loads(l) for l in open(os.path.join(out, p + ".jsonl"))]
    s = [l for l in lines if l.get("summary")][-1]
    evals = [l for l in lines if ("eval_accuracy" in l or "val_loss" in l) and not l.get("summary")]
    if model == "transformer":
        final[p] = s["val_loss"]
        trail = ", ".join(f"{l['step']}: {l['val_loss']:.3f}" for l in evals)
        print(f"{p:5s} validation loss {final[p]:.4f} nats/byte  (by step: {trail}; {s['skipped_steps']} skipped "
              f"steps, {s['tokens_per_s_overall']:.0f} tokens/s)")
    else:
        final[p] = 100 * s["eval_accuracy"]
        trail = ", ".join(f"{100 * l['eval_accuracy']:.2f}" for l in evals)
        print(f"{p:5s} test accuracy {final[p]:.2f}%  (per epoch: {trail}; {s['skipped_steps']} skipped steps, "
              f"{s['samples_per_s_overall']:.0f} samples/s)")
if "amp" in final and "fp32" in final:
    if model == "transformer":
        print(f"AMP / FP32 validation loss: {final['amp'] / final['fp32']:.4f} "
              f"({100 * (final['amp'] / final['fp32'] - 1):+.2f} %)")
    else:
        print(f"AMP - FP32: {final['amp'] - final['fp32']:+.2f} points")
PY
