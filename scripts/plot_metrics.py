#!/usr/bin/python3
"""One picture of one or more mixtrain metrics files (--metrics F, JSON Lines;
docs/flags.md, "The metrics file"), every panel against the optimizer step:

    /usr/bin/python3 scripts/plot_metrics.py RUN.jsonl [[LABEL=]MORE.jsonl ...] [-o OUT.png]

  (a) loss, and val_loss at each evaluation
  (b) loss scale (log axis), with the skipped steps and the outlier steps marked
  (c) grad_norm (log axis when it spans more than a decade; null lines left out)
  (d) learning rate
  (e) throughput: tokens/s for a run that has it (the Transformer), else samples/s
  (f) eval_accuracy at each evaluation

Several runs are overlaid, one colour each. Needs Debian's python3-matplotlib
(Agg backend, no display). For tests: `read_run(spec)` reads one file and
`build_figure(runs)` builds the figure without writing it; its axes carry the
labels (Axes.get_label) in PANELS, the skipped and outlier markers the gids
"skipped" and "outlier", and a run's lines in the loss panel its label.
"""
import json
import math
import sys
from pathlib import Path

USAGE = """usage: scripts/plot_metrics.py RUN.jsonl [[LABEL=]MORE.jsonl ...] [-o OUT.png]
One PNG of mixtrain metrics files (--metrics F): a grid of panels against the step: loss and val_loss, the
loss scale (log axis) with skipped and outlier steps marked, grad_norm, learning rate, throughput (tokens/s or
samples/s) and eval accuracy. Several files are overlaid, one colour each; prints the path it wrote.
  RUN.jsonl         a metrics file, labelled by its file name
  LABEL=RUN.jsonl   the same, labelled LABEL
  -o, --out OUT.png where the picture goes (default: next to the first file, its name with .png)
Exit 2 on a missing or empty file, one without step lines, or without matplotlib (scripts/setup.sh installs
Debian's python3-matplotlib)."""

PROG = "plot_metrics"
# The panels, row by row, as the labels of their axes.
PANELS = ("loss", "loss_scale", "grad_norm", "lr", "throughput", "eval_accuracy")


class MetricsError(Exception):
    """A file that cannot be plotted; the message names it."""


class Run:
    """One metrics file: its label, per-step lines, evaluation lines and summary (or None)."""

    def __init__(self, label, path, steps, evals, summary):
        self.label, self.path, self.steps, self.evals, self.summary = label, path, steps, evals, summary


def split_spec(spec):
    """(label or None, path) of a command-line argument: LABEL=PATH names the run, unless SPEC is a file itself."""
    if "=" in spec and not Path(spec).exists():
        label, path = spec.split("=", 1)
        if label and path:
            return label, Path(path)
    return None, Path(spec)


def read_run(spec, label=None):
    """Reads SPEC ([LABEL=]PATH) into a Run; raises MetricsError naming the file."""
    name, path = split_spec(str(spec))
    if not path.exists():
        raise MetricsError(f"{path}: no such file")
    if not path.is_file():
        raise MetricsError(f"{path}: not a file")
    steps, evals, summary = [], [], None
    with open(path, errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise MetricsError(f"{path}:{n}: not a JSON line ({e})") from None
            if not isinstance(obj, dict):
                raise MetricsError(f"{path}:{n}: not a JSON object")
            if obj.get("summary"):
                summary = obj
            elif "eval_accuracy" in obj or "val_loss" in obj:
                evals.append(obj)
            elif "step" in obj:
                steps.append(obj)
    if not steps and summary is None and not evals:
        raise MetricsError(f"{path}: empty file, no metrics lines")
    if not steps:
        raise MetricsError(f"{path}: no step lines (is it a mixtrain --metrics file?)")
    return Run(label or name or path.name, path, steps, evals, summary)


def number(v):
    """V as a finite float, or None (null, a bool, text, inf or NaN)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def series(lines, key, where=None):
    """(steps, values) of the lines that carry a finite KEY (and satisfy WHERE). A line that has KEY but null
    (grad_norm on an overflow) gives NaN, a gap in the plotted line; with no finite value at all, ([], [])."""
    xs, ys = [], []
    for line in lines:
        x, y = number(line.get("step")), number(line.get(key))
        if x is None or key not in line:
            continue
        ok = y is not None and (where is None or where(y))
        xs.append(x)
        ys.append(y if ok else math.nan)
    if all(math.isnan(y) for y in ys):
        return [], []
    return xs, ys


def throughput_key(run):
    return "tokens_per_s" if any(number(s.get("tokens_per_s")) is not None for s in run.steps) else "samples_per_s"


def label_runs(runs):
    """Runs without a LABEL= whose file names collide (run.sh's metrics.jsonl) get their folder's name too."""
    names = [r.path.name for r in runs]
    for r in runs:
        if r.label == r.path.name and names.count(r.label) > 1:
            r.label = f"{r.path.parent.name}/{r.path.name}"


def no_data(ax, what):
    ax.text(0.5, 0.5, f"no {what} in these files", ha="center", va="center", transform=ax.transAxes, color="gray")


def build_figure(runs):
    """The figure of RUNS (a list of Run): a matplotlib Figure, not yet written."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    colours = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    fig = Figure(figsize=(12, 10.5))
    axes = fig.subplots(3, 2, sharex=True)
    a_loss, a_scale, a_norm, a_lr, a_tput, a_acc = axes.flat
    for ax, name in zip(axes.flat, PANELS):
        ax.set_label(name)
    has = {k: False for k in ("loss", "scale", "norm", "lr", "tput", "acc")}
    tput_keys = {throughput_key(r) for r in runs}
    mixed_tput = len(tput_keys) > 1
    norm_values = []

    for i, run in enumerate(runs):
        c = colours[i % len(colours)]
        lw = 1.2
        xs, ys = series(run.steps, "loss")
        if xs:
            a_loss.plot(xs, ys, color=c, lw=lw, label=run.label)
            has["loss"] = True
        xs, ys = series(run.evals, "val_loss")
        if xs:
            a_loss.plot(xs, ys, color=c, lw=lw, ls="--", marker="o", ms=4, label=f"_{run.label} val_loss")
            has["loss"] = True

        xs, ys = series(run.steps, "loss_scale", lambda y: y > 0)
        if xs:
            a_scale.plot(xs, ys, color=c, lw=lw, label=run.label)
            has["scale"] = True
        scale_at = {x: y for x, y in zip(xs, ys) if not math.isnan(y)}
        for flag, marker, face in (("skipped", "x", c), ("outlier", "o", "none")):
            steps = [x for x in (number(s.get("step")) for s in run.steps if s.get(flag) is True) if x is not None]
            if steps:
                # At the scale the step left (or 1 where the line has none), so a skip shows where it happened.
                ys = [scale_at.get(x, 1.0) for x in steps]
                m, = a_scale.plot(steps, ys, ls="none", marker=marker, ms=9 if flag == "outlier" else 7, mew=1.6,
                                  color=c, mfc=face, label=f"_{run.label} {flag}")
                m.set_gid(flag)
                has["scale"] = True

        xs, ys = series(run.steps, "grad_norm")
        if xs:
            a_norm.plot(xs, ys, color=c, lw=lw, label=run.label)
            norm_values += [y for y in ys if not math.isnan(y)]
            has["norm"] = True

        xs, ys = series(run.steps, "lr")
        if xs:
            a_lr.plot(xs, ys, color=c, lw=lw, label=run.label)
            has["lr"] = True

        key = throughput_key(run)
        xs, ys = series(run.steps, key)
        if xs:
            unit = key.replace("_per_s", "/s")
            a_tput.plot(xs, ys, color=c, lw=lw, label=f"{run.label} ({unit})" if mixed_tput else run.label)
            has["tput"] = True

        xs, ys = series(run.evals, "eval_accuracy")
        if xs:
            a_acc.plot(xs, [100 * y for y in ys], color=c, lw=lw, marker="o", ms=4,
                       label=f"{run.label}: {100 * ys[-1]:.2f}%")
            has["acc"] = True

    a_loss.set_title("loss (line) and val_loss (dashed, at evaluations)")
    a_loss.set_ylabel("loss")
    a_scale.set_title("loss scale after the step; x skipped, o outlier")
    a_scale.set_ylabel("loss scale")
    a_scale.set_yscale("log", base=2)
    a_norm.set_title("grad_norm (FP32 gradients, before any clip)")
    a_norm.set_ylabel("grad_norm")
    positive = [v for v in norm_values if v > 0]
    if positive and max(positive) > 10 * min(positive):
        a_norm.set_yscale("log")
    a_lr.set_title("learning rate")
    a_lr.set_ylabel("lr")
    unit = next(iter(tput_keys)).replace("_per_s", "/s") if not mixed_tput else "tokens/s or samples/s"
    a_tput.set_title(f"throughput ({unit}, all ranks)")
    a_tput.set_ylabel(unit)
    a_acc.set_title("eval accuracy (legend: the last)")
    a_acc.set_ylabel("top-1 accuracy (%)")
    for ax, key, what in ((a_loss, "loss", "loss"), (a_scale, "scale", "loss_scale"), (a_norm, "norm", "grad_norm"),
                          (a_lr, "lr", "lr"), (a_tput, "tput", "samples_per_s or tokens_per_s"),
                          (a_acc, "acc", "eval_accuracy")):
        ax.grid(True, alpha=0.3)
        if not has[key]:
            no_data(ax, what)
    for ax in (a_tput, a_acc):
        ax.set_xlabel("step")
    if has["loss"]:
        handles, labels = a_loss.get_legend_handles_labels()
        handles.append(Line2D([], [], color="gray", ls="--", marker="o", ms=4))
        labels.append("val_loss")
        a_loss.legend(handles, labels, fontsize="small")
    marks = {m.get_gid() for m in a_scale.lines}
    proxies = [(Line2D([], [], ls="none", marker=marker, mfc=face, color="gray", mew=1.6), f"{flag} step")
               for flag, marker, face in (("skipped", "x", "gray"), ("outlier", "o", "none")) if flag in marks]
    if proxies:
        a_scale.legend(*zip(*proxies), fontsize="small")
    if has["tput"] and mixed_tput:
        a_tput.legend(fontsize="small")
    if has["acc"]:
        a_acc.legend(fontsize="small")
    fig.suptitle("mixtrain metrics: " + ", ".join(r.label for r in runs), fontsize="medium")
    fig.tight_layout()
    return fig


def parse(argv):
    """(run specs, output path or None) of the command line; exits 0 on --help, 2 on a bad argument."""
    specs, out = [], None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print(USAGE)
            sys.exit(0)
        if a in ("-o", "--out"):
            if i + 1 >= len(argv) or not argv[i + 1]:
                fail(f"{a} needs a value (see --help)")
            out = Path(argv[i + 1])
            i += 2
            continue
        if a.startswith("--out="):
            out = Path(a.split("=", 1)[1])
        elif a.startswith("-") and a != "-":
            fail(f"unknown argument '{a}' (see --help)")
        else:
            specs.append(a)
        i += 1
    if not specs:
        fail("no metrics file given (see --help)")
    return specs, out


def fail(message):
    print(f"{PROG}: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv):
    specs, out = parse(argv)
    try:
        runs = [read_run(s) for s in specs]
    except MetricsError as e:
        fail(str(e))
    label_runs(runs)
    if out is None:
        out = runs[0].path.with_suffix(".png")
    if any(out.resolve() == r.path.resolve() for r in runs):
        fail(f"{out}: the output would overwrite a metrics file; name another with -o")
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        fail(f"no matplotlib for {sys.executable} ({e}): scripts/setup.sh installs it "
             "(Debian: apt-get install python3-matplotlib)")
    fig = build_figure(runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
