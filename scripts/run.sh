#!/usr/bin/env bash
# The main job: two worker processes train an MLP on Fashion-MNIST in mixed
# precision, all-reducing FP16 gradients before the cast to FP32, with one
# loss-scaling decision shared by both ranks. Extra arguments go to mixtrain.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
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
