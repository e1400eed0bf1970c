#!/usr/bin/python3
"""scripts/plot_metrics.py on real metrics files: three short trainings on the
synthetic data (AMP, FP32, and AMP with an overflow injected at step 3, so step 3
is skipped) drawn overlaid into one PNG. The script must exit 0 and print the
path of a real PNG; the figure it builds (its build_figure, read back through
matplotlib) must hold the three runs in the loss panel, a log-scaled loss-scale
axis with the skipped step marked at step 3 and nothing marked in the runs
without a skip, a gap in grad_norm where the metrics say null, and an outlier
marker where a line carries "outlier": true. A missing file, an empty one and
one without step lines: exit 2, naming the file, and no PNG. Skipped (77)
without matplotlib for this Python.
"""
import json
import math
import sys

import mixtest as mt

SCRIPT = mt.SOURCE_DIR / "scripts" / "plot_metrics.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEPS = 6


def load_script():
    """scripts/plot_metrics.py as a module (its main does not run)."""
    return mt.load_script(SCRIPT)


def plot(args):
    return mt.launch([sys.executable, SCRIPT, *args], timeout=180)


def panels(fig):
    return {ax.get_label(): ax for ax in fig.axes}


def marked(ax, gid):
    """{run colour: steps} of the markers with GID in AX."""
    return {line.get_color(): sorted(float(x) for x in line.get_xdata()) for line in ax.lines if line.get_gid() == gid}


def main():
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        mt.skip(f"no matplotlib for {sys.executable} ({e}); scripts/setup.sh installs python3-matplotlib")
    c = mt.Checks("plot_metrics")
    d = mt.workdir("plot_metrics")
    base = ["--data", "synthetic", "--steps", STEPS, "--eval-every", 3, "--eval-batches", 2]
    runs = {"amp": ["--precision", "amp"], "fp32": ["--precision", "fp32"],
            "overflow": ["--precision", "amp", "--inject-overflow", 3]}
    for name, flags in runs.items():
        r = mt.mixtrain([*base, *flags, "--metrics", d / f"{name}.jsonl"])
        if not c.ok_run(r, f"mixtrain {' '.join(map(str, flags))}"):
            c.finish()
    over = mt.Metrics(d / "overflow.jsonl")
    c.check(over.step(3)["skipped"] is True and over.step(3)["grad_norm"] is None and len(over.evals) == 2,
            "the overflow run skipped step 3 (grad_norm null) and evaluated twice", json.dumps(over.step(3))[:200])

    # The command line: three runs overlaid, one named with LABEL=.
    out = d / "pictures" / "three.png"
    r = plot([d / "amp.jsonl", d / "fp32.jsonl", f"injected={d / 'overflow.jsonl'}", "-o", out])
    c.check(not r.timed_out and r.rc == 0, "plot_metrics.py of three runs: exit 0", r.describe(1500) if r.rc else "")
    c.check(r.stdout.strip() == str(out), "it prints the path it wrote", r.stdout.strip()[-300:])
    data = out.read_bytes() if out.is_file() else b""
    c.check(data[:8] == PNG_MAGIC, "the output is a PNG", f"{out}: {data[:8]!r}")
    c.check(len(data) > 20000, "the PNG is more than a blank page", f"{len(data)} bytes")

    # Without -o: next to the first file, its name with .png.
    r = plot([d / "fp32.jsonl"])
    want = d / "fp32.png"
    c.check(r.rc == 0 and r.stdout.strip() == str(want) and want.is_file() and want.read_bytes()[:8] == PNG_MAGIC,
            "without -o: RUN.png beside RUN.jsonl, its path printed", r.describe(600) if r.rc else r.stdout.strip())

    # What the figure holds, through matplotlib.
    pm = load_script()
    fig = pm.build_figure([pm.read_run(d / "amp.jsonl"), pm.read_run(d / "fp32.jsonl"),
                           pm.read_run(f"injected={d / 'overflow.jsonl'}")])
    ax = panels(fig)
    c.check(set(ax) >= set(pm.PANELS), "the figure has every panel", ", ".join(sorted(ax)))
    if not set(ax) >= set(pm.PANELS):
        c.finish()
    runs_drawn = [line.get_label() for line in ax["loss"].lines if not line.get_label().startswith("_")]
    c.check(runs_drawn == ["amp.jsonl", "fp32.jsonl", "injected"], "the loss panel holds the 3 runs, by label",
            f"{runs_drawn}")
    val = [line for line in ax["loss"].lines if line.get_label().endswith("val_loss")]
    c.check(len(val) == 3 and all(list(line.get_xdata()) == [3, 6] for line in val),
            "and each run's val_loss at steps 3 and 6", f"{[list(line.get_xdata()) for line in val]}")
    c.check(ax["loss_scale"].get_yscale() == "log", "the loss scale is on a log axis", ax["loss_scale"].get_yscale())
    scale_lines = {line.get_label(): list(line.get_ydata()) for line in ax["loss_scale"].lines
                   if not line.get_label().startswith("_")}
    c.check(scale_lines.get("fp32.jsonl") == [1.0] * STEPS and scale_lines.get("amp.jsonl", [0])[0] > 1,
            "FP32's loss scale is drawn at 1, AMP's above", f"{ {k: v[:2] for k, v in scale_lines.items()} }")
    colour = {line.get_label(): line.get_color() for line in ax["loss"].lines}
    skips = marked(ax["loss_scale"], "skipped")
    c.check(skips == {colour["injected"]: [3.0]}, "one skipped-step marker: step 3 of the overflow run",
            f"{skips}")
    c.check(not marked(ax["loss_scale"], "outlier"), "no outlier markers where no line has the field")
    norm = {line.get_label(): list(line.get_ydata()) for line in ax["grad_norm"].lines}
    gap = norm.get("injected", [])
    c.check(len(gap) == STEPS and math.isnan(gap[2]) and not any(math.isnan(v) for v in norm.get("amp.jsonl", [])),
            "grad_norm: a gap at the overflow run's null, none in the AMP run", f"{gap}")

    # A future line's "outlier": true is marked; a run without the field is still drawn beside it.
    lines = [json.loads(x) for x in open(d / "amp.jsonl")]
    for obj in lines:
        if "loss" in obj and "summary" not in obj:
            obj["outlier"] = obj["step"] == 4
            obj["skipped"] = obj["skipped"] or obj["outlier"]
    (d / "outlier.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    fig = pm.build_figure([pm.read_run(d / "outlier.jsonl"), pm.read_run(d / "fp32.jsonl")])
    outliers = marked(panels(fig)["loss_scale"], "outlier")
    c.check(list(outliers.values()) == [[4.0]], "an outlier line is marked at its step", f"{outliers}")

    # Files that cannot be drawn: exit 2 naming the file, nothing written.
    (d / "empty.jsonl").write_text("")
    (d / "no_steps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines if "loss" not in x))
    for name, what in (("missing.jsonl", "a missing file"), ("empty.jsonl", "an empty file"),
                       ("no_steps.jsonl", "a file of evaluation and summary lines only")):
        bad_out = d / f"bad_{name}.png"
        r = plot([d / "amp.jsonl", d / name, "-o", bad_out])
        c.check(r.rc == 2 and str(d / name) in r.stderr and not bad_out.exists(),
                f"{what}: exit 2 naming it, no PNG", r.stderr.strip()[-300:] if r.rc == 2 else r.describe(600))
    r = plot([d / "amp.jsonl", "--no-such-flag"])
    c.check(r.rc == 2 and "--no-such-flag" in r.stderr and "--help" in r.stderr,
            "an unknown flag: exit 2 naming it and --help", r.stderr.strip())
    c.finish()


if __name__ == "__main__":
    sys.exit(main())
