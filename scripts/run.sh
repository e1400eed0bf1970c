#!/usr/bin/env bash
# The main job: two worker processes train an MLP on Fashion-MNIST in mixed
# precision, all-reducing FP16 gradients before the cast to FP32, with one
# loss-scaling decision shared by both ranks. Extra arguments go to mixtrain.
# Last, scripts/plot_metrics.py draws the metrics into metrics.png beside them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=run.sh
source "$root/scripts/lib/args.sh"  # usage_if_help
usage_if_help "$@" <<'EOF'
usage: scripts/run.sh [MIXTRAIN FLAGS...]
The main job, after scripts/setup.sh and scripts/build.sh: two ranks train an MLP on Fashion-MNIST in mixed
precision, all-reducing FP16 gradients before the cast to FP32, with one loss-scaling decision shared by both
ranks; prints the test accuracy and writes metrics.jsonl, model.safetensors and metrics.png (the run's curves,
scripts/plot_metrics.py; a plot that fails is a warning, not a failed run).
  MIXTRAIN FLAGS   go to mixtrain after its defaults here, which they override (--model mlp --data fashion-mnist
                   --precision amp --epochs 2 --batch-size 64 --lr 0.05 --lr-schedule cosine), e.g. --epochs 5
  MIX_BUILD_DIR    the build folder (default: build/ of this checkout)
  MIX_RUN_DIR      where the metrics and checkpoint go (default: runs/default of this checkout)
  MIX_CMAKE_ARGS   as in scripts/build.sh --help
Only a first argument -h or --help is this script's; mixtrain's own help: build/mixtrain --help.
EOF
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build="${MIX_BUILD_DIR:-$root/build}"
out="${MIX_RUN_DIR:-$root/runs/default}"
mkdir -p "$out"
metrics="$out/metrics.jsonl"
"$build/mixrun" -n 2 -- "$build/mixtrain" --model mlp --data fashion-mnist --precision amp \
  --epochs 2 --batch-size 64 --lr 0.05 --lr-schedule cosine \
  --metrics "$metrics" --save "$out/model.safetensors" "$@"
echo
/usr/bin/python3 - "$metrics" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
s = [l for l in lines if l.get("summary")][-1]
print(f"test accuracy: {100 * s['eval_accuracy']:.2f}%  ({s['steps']} steps on {s['world_size']} ranks, "
      f"{s['skipped_steps']} skipped, final loss scale {s.get('final_loss_scale')})")
PY
echo "metrics: $metrics"
echo "checkpoint: $out/model.safetensors"
# The picture of the run; the training is done, so a plot that fails (no
# matplotlib, say) only warns.
if png="$(/usr/bin/python3 "$root/scripts/plot_metrics.py" "$metrics" -o "$out/metrics.png")"; then
  echo "plot: $png"
else
  echo "run.sh: warning: no plot of $metrics (scripts/plot_metrics.py failed, see above; the run itself succeeded)" >&2
fi
