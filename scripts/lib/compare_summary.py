"""The GPU check's "mixtrain against PyTorch" table: each row of scripts/torch_compare.py beside
mixtrain's row of the same name (its metrics file in the check's --out folder), the ratio
mixtrain / PyTorch, and both MFUs (scripts/lib/mfu.py).

    python3 scripts/lib/compare_summary.py --out DIR [--rows PATTERNS] [--torch FILE] [--gpu-name NAME]
                                           [--torch-exit RC]

DIR holds mixtrain's NAME.jsonl files (gpu_check's logs); FILE is torch_compare's JSON lines
(default DIR/torch_compare.jsonl). A torch.compile row (NAME_compile) sits beside mixtrain's
NAME. Rates are mixtrain's summary line's samples_per_s_overall (images/s) or
tokens_per_s_overall, and torch_compare's samples_per_s or tokens_per_s. --rows takes
torch_compare's --rows PATTERNS (default: every row), so that the rows the check did not ask
PyTorch for are left out rather than shown as missing. Prints the table on stdout; always
exits 0 (a missing file is a row that says so).
"""
import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import mfu  # noqa: E402
import torch_compare  # noqa: E402  (scripts/torch_compare.py: its rows; torch is not imported)


def last_summary(path):
    """The last `"summary": true` line of a mixtrain metrics file, or None."""
    try:
        lines = [json.loads(line) for line in open(path) if line.strip()]
    except (OSError, ValueError):
        return None
    lines = [d for d in lines if d.get("summary")]
    return lines[-1] if lines else None


def torch_rows(path):
    rows = {}
    try:
        for line in open(path):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if isinstance(d, dict) and "row" in d:
                rows[d["row"]] = d
    except OSError:
        pass
    return rows


def pct(x):
    return f"{100 * x:5.1f}%" if x is not None else "   n/a"


def mib(b):
    return f"{b / 2**20:.0f}" if isinstance(b, (int, float)) and b > 0 else "n/a"


def lines(out_dir, torch_file, gpu_name, torch_exit, rows="*"):
    tr = torch_rows(torch_file)
    any_row = next(iter(tr.values()), {})
    name = gpu_name or any_row.get("device_name") or ""
    peak, peak_what = mfu.peak_tflops(name)
    head = (f"mixtrain against PyTorch {any_row.get('torch') or ('(none)' if tr else '(no PyTorch row)')} on {name or 'an unnamed card'}: "
            f"dense FP16/BF16 peak {f'{peak:g} TFLOPS' if peak else 'unknown'} ({peak_what}); "
            f"torch_compare exit {torch_exit}")
    reasons = {f"{d.get('status')}: {d.get('error')}" for d in tr.values() if d.get("status") != "ok"}
    shared = reasons.pop() if len(reasons) == 1 and all(d.get("status") != "ok" for d in tr.values()) else None
    if shared:  # the whole PyTorch side stopped for one reason (no PyTorch, no GPU): say it once
        head += f"\n  every PyTorch row {shared}"
    out = [head,
           f"  {'row':27s} {'batch':>5s} {'unit':6s} {'mixtrain':>10s} {'MFU':>6s} {'PyTorch':>10s} {'MFU':>6s} "
           f"{'mix/PT':>6s}  peak MiB mix / PT"]
    for row, model, batch, mode in torch_compare.select_rows(rows):
        cfg = mfu.MODELS[model]
        flops, unit = mfu.flops_per_unit(cfg)
        field = "tokens_per_s_overall" if unit == "token" else "samples_per_s_overall"
        base = row[:-len("_compile")] if row.endswith("_compile") else row
        s = last_summary(Path(out_dir) / f"{base}.jsonl")
        mix = s.get(field) if s else None
        t = tr.get(row)
        if mix is None and t is None:
            continue  # neither ran: nothing to put side by side
        pt = t.get("tokens_per_s" if unit == "token" else "samples_per_s") if t and t.get("status") == "ok" else None
        pt_flops = t.get("flops_per_unit", flops) if t else flops  # a --smoke row counts its own model
        mix_s = f"{mix:10.1f}" if isinstance(mix, (int, float)) else f"{'n/a':>10s}"
        if pt is not None:
            pt_s = f"{pt:10.1f}"
            ratio = f"{mix / pt:6.2f}" if isinstance(mix, (int, float)) and pt > 0 else f"{'n/a':>6s}"
        else:
            pt_s, ratio = f"{'n/a':>10s}", f"{'n/a':>6s}"
        line = (f"  {row:27s} {batch:5d} {('tok/s' if unit == 'token' else 'img/s'):6s} {mix_s} "
                f"{pct(mfu.mfu(mix, flops, peak))} {pt_s} {pct(mfu.mfu(pt, pt_flops, peak))} {ratio}  "
                f"{mib(s.get('peak_bytes') if s else None)} / {mib(t.get('peak_bytes') if t else None)}")
        skips = [s.get("skipped_steps") if s else None, t.get("skipped_steps") if t else None]
        if any(isinstance(n, int) and n > 0 for n in skips):  # skipped steps run shorter: say so beside the rate
            line += f"  (skipped steps mix {skips[0] if skips[0] is not None else 'n/a'} / PT " \
                    f"{skips[1] if skips[1] is not None else 'n/a'})"
        if mix is None:
            line += f"  (no mixtrain figure in {base}.jsonl)"
        if t is None:
            line += "  (no PyTorch row: torch_compare did not reach it)"
        elif t.get("status") != "ok" and not shared:
            line += f"  (PyTorch {t.get('status')}: {str(t.get('error'))[:120]})"
        out.append(line)
    out.append("  model FLOPs (scripts/lib/mfu.py), MFU = rate x FLOPs / peak:")
    out += [f"    {line}" for line in mfu.describe_flops()]
    return out


def main(argv):
    p = argparse.ArgumentParser(prog="compare_summary.py")
    p.add_argument("--out", required=True)
    p.add_argument("--rows", default="*")
    p.add_argument("--torch", default=None)
    p.add_argument("--gpu-name", default="")
    p.add_argument("--torch-exit", default="n/a")
    a = p.parse_args(argv)
    print("\n".join(lines(a.out, a.torch or str(Path(a.out) / "torch_compare.jsonl"), a.gpu_name, a.torch_exit,
                          a.rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
