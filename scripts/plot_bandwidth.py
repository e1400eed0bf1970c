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
A row without a ratio says why: a count or model measured in one dtype only
("no fp32 run"), or a divisor of 0 ("fp32 time is 0").
With Debian's python3-matplotlib it also writes DIR/allreduce_busbw.png (bus
bandwidth against message size, one line per dtype) and DIR/grad_sync.png (time
per sync per model, FP16 against FP32 all-reduce, on a log axis: ResNet-50's
sync takes orders of magnitude longer than the MLP's).
"""
import csv
import sys
from pathlib import Path

USAGE = """usage: scripts/plot_bandwidth.py DIR
Tables and plots of scripts/bandwidth.sh's CSV files: reads DIR/allreduce.csv and DIR/grad_sync.csv, prints the
FP16 / FP32 time ratios (a row without one says why) and, with python3-matplotlib, writes DIR/allreduce_busbw.png
and DIR/grad_sync.png (time per sync per model, log axis).
  DIR   the --out DIR of scripts/bandwidth.sh (there by default runs/bandwidth of this checkout)"""


def read(path):
    return list(csv.DictReader(open(path))) if path.exists() else []


def cell(v, spec, width):
    """V formatted by SPEC, right-aligned in WIDTH; "-" where V is None."""
    return f"{v:>{width}{spec}}" if v is not None else f"{'-':>{width}}"


def ratio(num, den, den_name, why):
    """num / den, or None: where one side was not measured (the caller says which), or den is 0 (said in WHY)."""
    if num is None or den is None:
        return None
    if den == 0:
        why.append(f"{den_name} is 0")
        return None
    return num / den


def reason(why):
    return f"  ({'; '.join(why)})" if why else ""


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
        counts = sorted({c for (t, c) in by if t in ("half", "float")})
        print(f"all-reduce, {world} ranks ({ar[0]['backend']}): the same element count in FP16 and in FP32")
        print(f"{'elements':>12} {'FP16 size':>10} {'FP16 us':>10} {'FP32 us':>10} {'FP16/FP32':>9}")
        for c in counts:
            h, f = by.get(("half", c)), by.get(("float", c))
            why = [f"no {t} run" for t, r in (("half", h), ("float", f)) if r is None]
            th, tf = (float(r["time_us"]) if r else None for r in (h, f))
            size = human(int(h["size"])) if h else None
            print(f"{c:>12} {cell(size, '', 10)} {cell(th, '.1f', 10)} {cell(tf, '.1f', 10)} "
                  f"{cell(ratio(th, tf, 'float time', why), '.2f', 9)}{reason(why)}")
        if any(("half", c) not in by or ("float", c) not in by for c in counts):
            print("(one dtype only: the sweep steps the size in bytes, so its ends hold counts the other never ran)")
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
            h, f = rows.get("fp16"), rows.get("fp32")
            why = [f"no {mode} run" for mode, r in (("fp16", h), ("fp32", f)) if r is None]
            hb, fb = (int(r["bytes"]) if r else None for r in (h, f))
            ht, ft = (float(r["time_us"]) / 1e3 if r else None for r in (h, f))
            br = ratio(hb, fb, "fp32 bytes", why)
            tr = ratio(ht, ft, "fp32 time", why)
            print(f"{m:>12} {cell(hb, 'd', 12)} {cell(fb, 'd', 12)} {cell(br, '.3f', 11)} {cell(ht, '.2f', 9)} "
                  f"{cell(ft, '.2f', 9)} {cell(tr, '.2f', 10)}{reason(why)}")

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
        drawn = False
        for k, (mode, label) in enumerate((("fp16", "FP16 all-reduce"), ("fp32", "FP32 all-reduce"))):
            xs, ms = [], []
            for i, m in enumerate(models):
                t = next((float(r["time_us"]) / 1e3 for r in gs if r["model"] == m and r["grad_reduce"] == mode), None)
                x = i + (k - 0.5) * width
                if t is not None and t > 0:
                    xs.append(x)
                    ms.append(t)
                else:  # nothing to draw on a log axis: say why at the foot of the slot
                    ax.text(x, 0.02, "no run" if t is None else "0 ms", transform=ax.get_xaxis_transform(),
                            ha="center", va="bottom", fontsize="x-small", rotation=90)
            bars = ax.bar(xs, ms, width, label=label, color=f"C{k}")
            ax.bar_label(bars, fmt="%.3g", fontsize="x-small")
            drawn = drawn or bool(ms)
        if drawn:  # the MLP's sync is a sliver beside ResNet-50's on a linear axis
            ax.set_yscale("log")
        ax.set_xticks(range(len(models)), models)
        ax.set_xlim(-0.6, len(models) - 0.4)  # the slots of missing bars too
        ax.set_ylabel("time per gradient sync (ms, log)" if drawn else "time per gradient sync (ms)")
        ax.set_title(f"gradient sync of one AMP step, {gs[0]['world']} ranks, {gs[0]['backend']}")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "grad_sync.png", dpi=110)
        print(f"wrote {out / 'grad_sync.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
