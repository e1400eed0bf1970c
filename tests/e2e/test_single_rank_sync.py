#!/usr/bin/python3
"""One rank trains without gradient all-reduces (collective/elide_single_rank_sync.h).

Checks:
  1. One rank, AMP, small buckets, --grad-accum-steps 2: the run with its
     all-reduces taken out (the default) and the run with
     --no-elide-single-rank-sync write bit-identical checkpoints and the same
     loss, loss scale and grad_norm each step; grad_bytes is 0 without the
     all-reduces and 2 bytes a parameter with them (the FP16 buckets);
  2. the same for a tied Transformer under AMP (an FP32 bucket beside the
     FP16 ones: the token embedding's gradient) without accumulation;
  3. the log names the pass and the flag; --print-program shows no gradient
     c_allreduce_start and the pass's count, and with the flag the pass is off
     and the starts are there;
  4. on 2 ranks the pass is off ("2 ranks") and the all-reduces stay.
"""
import re
import sys

import mixtest as mt

MLP = [*mt.synthetic(size=512, features=32, classes=5, hidden=(16, 16)), "--eval", "false", "--precision", "amp",
       "--bucket-mb", "0.0005", "--batch-size", 8, "--steps", 4, "--seed", 3]
# The 2-layer tied Transformer of the small presets, on the embedded text.
GPT = ["--model", "transformer", "--layers", 2, "--d-model", 32, "--heads", 2, "--context", 16, "--tie-weights",
       "--precision", "amp", "--eval", "false", "--batch-size", 4, "--steps", 3, "--bucket-mb", "0.01", "--seed", 3]
FLAG = "--no-elide-single-rank-sync"


def train_both(c, d, name, args):
    """The run with and without the flag: {elided: (metrics, tensors, output)}."""
    runs = {}
    for elided in (True, False):
        tag = f"{name}_{'elided' if elided else 'kept'}"
        met, ckpt = d / f"{tag}.jsonl", d / f"{tag}.safetensors"
        r = mt.mixtrain([*args, *([] if elided else [FLAG]), "--metrics", met, "--save", ckpt], timeout=180)
        if c.ok_run(r, f"{name}, one rank, {'all-reduces taken out' if elided else FLAG}"):
            runs[elided] = (mt.Metrics(met), mt.load_checkpoint(ckpt)[0], r.out)
    return runs


def compare(c, name, runs, params):
    if len(runs) != 2:
        return
    (me, te, out), (mk, tk, out_kept) = runs[True], runs[False]
    differing = sorted(k for k in tk if k not in te or not mt.bit_identical(te[k], tk[k]))
    c.check(set(te) == set(tk) and not differing, f"{name}: every tensor of the checkpoints bit-identical",
            f"{len(tk)} tensors; differing: {differing[:3]}")
    fields = ("loss", "loss_scale", "found_inf", "grad_norm")
    c.check([[s[f] for f in fields] for s in me.steps] == [[s[f] for f in fields] for s in mk.steps],
            f"{name}: the same {', '.join(fields)} each step", f"{len(me.steps)} steps")
    c.check({s["grad_bytes"] for s in me.steps} == {0}, f"{name}: grad_bytes 0 without the all-reduces",
            f"{sorted({s['grad_bytes'] for s in me.steps})}")
    kept_bytes = {s["grad_bytes"] for s in mk.steps}
    c.check(kept_bytes == {params}, f"{name}: with {FLAG}, grad_bytes is each bucket's bytes once",
            f"{sorted(kept_bytes)} against {params}")
    c.check("elide_single_rank_sync" in out and f"({FLAG} turns it off)" in out,
            f"{name}: the log names the pass and its flag")
    c.check("elide_single_rank_sync" not in out_kept, f"{name}: with {FLAG} the log does not name it")


def pass_line(out):
    """The pass's line of --print-program's pass list ("  24. elide_single_rank_sync: ...")."""
    return [ln for ln in out.splitlines() if re.match(r"\s*\d+\. elide_single_rank_sync:", ln)]


def starts(out):
    return [op for op in mt.program_ops(out).values()
            if op.type == "c_allreduce_start" and op.attr("traffic") == '"gradients"']


def main():
    mt.require_mixtrain()
    c = mt.Checks("single_rank_sync")
    d = mt.workdir("single_rank_sync")

    # 1. The MLP 32-16-16-5 under AMP: every gradient FP16, 2 bytes a parameter.
    mlp_params = 32 * 16 + 16 + 16 * 16 + 16 + 16 * 5 + 5
    compare(c, "MLP AMP, --grad-accum-steps 2", train_both(c, d, "mlp", [*MLP, "--grad-accum-steps", 2]),
            2 * mlp_params)

    # 2. The tied Transformer: the sum of its buckets' bytes, read from --print-program.
    r = mt.mixtrain([*GPT, FLAG, "--print-program"], timeout=60)
    if c.ok_run(r, f"Transformer AMP {FLAG} --print-program"):
        # The gradient sync's summary: "bucket 3: f32, 4096 bytes, ...".
        buckets = re.findall(r"bucket \d+: (\w+), (\d+) bytes", r.out)
        total = sum(int(b) for _, b in buckets)
        dtypes = {dt for dt, _ in buckets}
        c.check(dtypes == {"f16", "f32"} and len(buckets) == len(starts(r.out)) > 2,
                "Transformer: FP16 and FP32 buckets, several", f"{len(buckets)} buckets, {sorted(dtypes)}")
        compare(c, "tied Transformer AMP", train_both(c, d, "gpt", GPT), total)

    # 3. --print-program on one rank, with and without the flag.
    kept_starts = None
    for elided in (False, True):
        r = mt.mixtrain([*MLP, *([] if elided else [FLAG]), "--print-program"], timeout=60)
        if not c.ok_run(r, f"--print-program, one rank{'' if elided else ', ' + FLAG}"):
            continue
        line = pass_line(r.out)
        if elided:
            c.check(not starts(r.out), "one rank: no gradient c_allreduce_start in the program")
            c.check(line and line[0].rstrip().endswith(f": {kept_starts} buckets' all-reduces"),
                    "one rank: the pass list counts the buckets whose all-reduces it took out", f"{line}")
        else:
            kept_starts = len(starts(r.out))
            c.check(kept_starts > 1, f"{FLAG}: the gradient all-reduces are there", f"{kept_starts}")
            c.check(line and line[0].rstrip().endswith(f"off, {FLAG}"), f"{FLAG}: the pass list says off", f"{line}")

    # 4. Two ranks: nothing taken out.
    if mt.have_mpirun():
        r = mt.mixtrain([*MLP, "--print-program"], np=2, timeout=60)
        if c.ok_run(r, "--print-program, 2 ranks"):
            line = pass_line(r.out)
            c.check(line and line[0].rstrip().endswith("off, 2 ranks"), "2 ranks: the pass is off", f"{line}")
            c.check(len(starts(r.out)) > 1, "2 ranks: the gradient all-reduces are there")
    else:
        print("skip: 2 ranks (no mpirun)")
    c.finish()


if __name__ == "__main__":
    sys.exit(main())
