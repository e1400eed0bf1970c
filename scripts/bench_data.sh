#!/usr/bin/env bash
# Images/s of mixtrain's image reader (mixbench data) against torchvision's
# ImageFolder + DataLoader on the same JPEGs, the same transforms and as many
# workers, measured one after the other in one run; and the peak resident set
# of mixbench data over one epoch of N and of 4N images (it must not grow with the images).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=bench_data.sh
source "$root/scripts/lib/args.sh"
usage_if_help "$@" <<'EOF2'
usage: scripts/bench_data.sh [--data-dir DIR] [--images N] [--workers N] [--batches K] [--image-size S]
Images/s of `mixbench data` against torchvision's ImageFolder + DataLoader (scripts/bench_data_torchvision.py)
on the same JPEGs with the ImageNet training transforms and the same number of workers, and the ratio; then
the peak resident set of `mixbench data --data-workers 1` over one epoch of a folder of N and of 4N images.
  --data-dir DIR   an ImageFolder (DIR/train/<class>/*.jpg); default: N synthetic 500x375 JPEGs made with
                   Pillow in $MIX_RUN_DIR (default runs/bench_data), ImageNet's typical size
  --images N       images of the made folder (default 2000)
  --workers N      decoding workers of both readers (default 1)
  --batches K      timed batches of 64 (default 20)
  --image-size S   crop size (default 224)
Needs a build (scripts/build.sh), python3-pil and python3-torchvision (scripts/setup.sh installs them).
EOF2
dir="" images=2000 workers=1 batches=20 size=224
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage ;;
    --data-dir) need_value "$@"; dir="$2"; shift 2 ;;
    --images) need_value "$@"; positive "$1" "$2"; images="$2"; shift 2 ;;
    --workers) need_value "$@"; positive "$1" "$2"; workers="$2"; shift 2 ;;
    --batches) need_value "$@"; positive "$1" "$2"; batches="$2"; shift 2 ;;
    --image-size) need_value "$@"; positive "$1" "$2"; size="$2"; shift 2 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
build="${MIX_BUILD_DIR:-$root/build}"
run_dir="${MIX_RUN_DIR:-$root/runs/bench_data}"
[ -x "$build/mixbench" ] || die "no $build/mixbench: run scripts/build.sh first"

# N synthetic JPEGs in 10 classes: smooth colour fields with noise, so that
# they compress and decode like photographs, not like flat colour or static.
make_folder() {  # DIR COUNT
  /usr/bin/python3 - "$1" "$2" <<'PY'
import os, random, sys
from PIL import Image, ImageFilter
out, count = sys.argv[1], int(sys.argv[2])
rng = random.Random(0)
# count training images, and 2 a class for val (the reader needs a val split).
for i in range(count + 20):
    split, cls = ("train", i % 10) if i < count else ("val", (i - count) % 10)
    d = os.path.join(out, split, f"c{cls}")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{i:06d}.jpg")
    if os.path.exists(path):
        continue
    small = Image.new("RGB", (25, 19))
    small.putdata([(rng.randrange(256), rng.randrange(256), rng.randrange(256)) for _ in range(25 * 19)])
    img = small.resize((500, 375), Image.BICUBIC).filter(ImageFilter.GaussianBlur(2))
    noise = Image.effect_noise((500, 375), 12).convert("RGB")
    Image.blend(img, noise, 0.15).save(path, quality=90)
PY
}

if [ -z "$dir" ]; then
  dir="$run_dir/folder_$images"
  make_folder "$dir" "$images"
fi
# Each reader twice, alternating, and the faster of its two runs: on a shared
# machine a burst of other work in one run would otherwise decide the ratio.
mix_runs=() tv_runs=()
for round in 1 2; do
  echo "== round $round: mixbench data, $workers worker(s)"
  mix_runs+=("$("$build/mixbench" data --data image-folder --data-dir "$dir" --image-size "$size" --batch-size 64 \
    --data-workers "$workers" --batches "$batches" | tee /dev/stderr | tail -1)")
  echo "== round $round: torchvision ImageFolder + DataLoader, $workers worker(s)"
  tv_runs+=("$(/usr/bin/python3 "$root/scripts/bench_data_torchvision.py" "$dir" --image-size "$size" --batch-size 64 \
    --workers "$workers" --batches "$batches" | tail -1)")
  echo "${tv_runs[-1]}"
done
/usr/bin/python3 - "${mix_runs[@]}" "${tv_runs[@]}" <<'PY'
import json, sys
runs = [json.loads(a) for a in sys.argv[1:]]
half = len(runs) // 2
m = max(r["images_per_s_per_worker"] for r in runs[:half])
t = max(r["images_per_s_per_worker"] for r in runs[half:])
print(f"per worker (the faster of two runs each): mixtrain {m:.0f} images/s, torchvision {t:.0f} images/s: "
      f"{m / t:.2f}x")
PY

echo "== peak resident set of one epoch over $images and over $((4 * images)) images (1 worker)"
small="$run_dir/folder_$images" large="$run_dir/folder_$((4 * images))"
make_folder "$small" "$images"
make_folder "$large" "$((4 * images))"
a=$("$build/mixbench" data --data image-folder --data-dir "$small" --image-size "$size" --data-workers 1 \
  --batches "$((images / 64))" | tail -1)
b=$("$build/mixbench" data --data image-folder --data-dir "$large" --image-size "$size" --data-workers 1 \
  --batches "$((4 * images / 64))" | tail -1)
/usr/bin/python3 - "$a" "$b" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"peak RSS: {a['training_images']} images {a['peak_rss_bytes'] / 2**20:.1f} MiB, {b['training_images']} images "
      f"{b['peak_rss_bytes'] / 2**20:.1f} MiB: ratio {b['peak_rss_bytes'] / a['peak_rss_bytes']:.3f}")
PY
