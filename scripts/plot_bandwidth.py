#!/usr/bin/python3
"""Tables and plots of scripts/bandwidth.sh's CSV files.

    /usr/bin/python3 scripts/plot_bandwidth.py DIR

Reads DIR/allreduce.csv (mixbench allreduce) and DIR/grad_sync.csv (mixbench
grad-sync) and prints:
  - all-reduce: for every element count measured in both half and float, the
    out-of-place time of each and the ratio half / float (the same gradients
    sent as FP16 instead of FP32);
  - gradient sync: per model, bytes per rank and time per sync with FP16 and with
    FP32 all-reduce, and their ratios.
With Debian's python3-matplotlib it also writes DIR/allreduce_busbw.png (bus
bandwidth against message size, one line per dtype) and DIR/grad_sync.png (time
per sync per model, FP16 against FP32 all-reduce).
"""
import csv
import sys
from pathlib import Path

USAGE = """usage: scripts/plot_bandwidth.py DIR
Tables and plots of scripts/bandwidth.sh's CSV files: reads DIR/allreduce.csv and DIR/grad_sync.csv, prints the
FP16 / FP32 time ratios and, with python3-matplotlib, writes DIR/allreduce_busbw.png and DIR/grad_sync.png.
  DIR   the --out DIR of scripts/bandwidth.sh (there by default runs/bandwidth of this checkout)"""


def read(path):
    return list(csv.DictReader(open(path))) if path.exists() else []


def human(n):
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024


def main():
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    out = Path(sys.argv[1])
    ar = [r for r in read(out / "allreduce.csv") if r["redop"] == "sum"]
    gs = read(out / "grad_sync.csv")
    if not ar and not gs:
        print(f"plot_bandwidth: no allreduce.csv or grad_sync.csv in {out}", file=sys.stderr)
        return 1

    if ar:
        world = ar[0]["world"]
        by = {(r["type"], int(r["count"])): r for r in ar}
        counts = sorted({c for (t, c) in by if t == "half"} & {c for (t, c) in by if t == "float"})
        print(f"all-reduce, {world} ranks ({ar[0]['backend']}): the same element count in FP16 and in FP32")
        print(f"{'elements':>12} {'FP16 size':>10} {'FP16 us':>10} {'FP32 us':>10} {'FP16/FP32':>9}")
        for c in counts:
            h, f = by[("half", c)], by[("float", c)]
            th, tf = float(h["time_us"]), float(f["time_us"])
            print(f"{c:>12} {human(int(h['size'])):>10} {th:>10.1f} {tf:>10.1f} {th / tf:>9.2f}")
    if gs:
        print("\ngradient sync per training step (mixbench grad-sync, AMP programs)")
        print(f"{'model':>12} {'FP16 bytes':>12} {'FP32 bytes':>12} {'bytes ratio':>11} {'FP16 ms':>9} "
              f"{'FP32 ms':>9} {'time ratio':>10}")
        models = []
        for r in gs:
            if r["model"] not in models:
                models.append(r["model"])
        for m in models:
            rows = {r["grad_reduce"]: r for r in gs if r["model"] == m}
            if "fp16" not in rows or "fp32" not in rows:
                continue
            h, f = rows["fp16"], rows["fp32"]
            print(f"{m:>12} {int(h['bytes']):>12} {int(f['bytes']):>12} {int(h['bytes']) / int(f['bytes']):>11.3f} "
                  f"{float(h['time_us']) / 1e3:>9.2f} {float(f['time_us']) / 1e3:>9.2f} "
                  f"{float(h['time_us']) / float(f['time_us']):>10.2f}")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\nplot_bandwidth: no matplotlib (apt-get install python3-matplotlib): tables only")
        return 0
    if ar:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for t in sorted({r["type"] for r in ar}):
            rows = sorted((r for r in ar if r["type"] == t), key=lambda r: int(r["size"]))
            ax.plot([int(r["size"]) for r in rows], [float(r["busbw"]) for r in rows], marker="o", ms=3, label=t)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"all-reduce (sum, out of place), {ar[0]['world']} ranks, {ar[0]['backend']}")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "allreduce_busbw.png", dpi=110)
        print(f"\nwrote {out / 'allreduce_busbw.png'}")
    if gs:
        models = []
        for r in gs:
            if r["model"] not in models:
                models.append(r["model"])
        fig, ax = plt.subplots(figsize=(7, 4.2))
        width = 0.38
        for k, (mode, label) in enumerate((("fp16", "FP16 all-reduce"), ("fp32", "FP32 all-reduce"))):
            ms = [next((float(r["time_us"]) / 1e3 for r in gs if r["model"] == m and r["grad_reduce"] == mode), 0.0)
                  for m in models]
            ax.bar([i + (k - 0.5) * width for i in range(len(models))], ms, width, label=label)
        ax.set_xticks(range(len(models)), models)
        ax.set_ylabel("time per gradient sync (ms)")
        ax.set_title(f"gradient sync of one AMP step, {gs[0]['world']} ranks, {gs[0]['backend']}")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "grad_sync.png", dpi=110)
        print(f"wrote {out / 'grad_sync.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
