#!/usr/bin/python3
"""Overlapped gradient sync and overflow provenance (collective/grad_allreduce_pass.h,
collective/found_inf_allreduce_op.cc).

With overlap (the default) each gradient bucket's all-reduce starts as soon as
backward has written the bucket and is waited for after backward; --no-overlap
starts every bucket after backward, right before its wait. Both make the same
collective calls on the same buffers, so:
  1. 2 ranks, 10 steps, small buckets (several per dtype): FP32 and AMP runs of
     the MLP, an AMP run of resnet-small (FP16 and FP32 buckets side by side)
     and of a Transformer with tied embeddings (the tied gradient is the sum
     of two backward ops' parts, so its bucket may start only after the sum),
     save bit-identical parameters with and without overlap; and in each
     printed program every bucket's start follows the op that wrote its last
     gradient, its wait is where the summary says, and under AMP the bucket's
     unscale comes right after its own wait, before the next bucket's;
  2. 4 ranks with an odd number of buckets (read from --print-program's
     summary, which also shows starts inside backward): no deadlock (the run
     ends within its timeout), and bit-identical to --no-overlap on 4 ranks;
  3. provenance: --inject-overflow STEP:RANK:PARAM makes rank 0 log that
     parameter and that rank, and the skipped step's metrics line carry
     overflow_params == [PARAM] and overflow_ranks == [RANK]; other steps carry
     neither; without PARAM every parameter is named, on that rank only; with
     no RANK, every rank is named.
"""
import re
import sys

import mixtest as mt

STEPS = 10


def bucket_summary(out):
    """[(bucket, dtype, starts_inside_backward)] from --print-program's gradient all-reduce summary."""
    rows = []
    for m in re.finditer(r"bucket (\d+): (\w+), \d+ bytes.*\n\s+starts at op \d+.*?; (\d+) backward op", out):
        rows.append((int(m.group(1)), m.group(2), int(m.group(3)) > 0))
    return rows


def check_placement(c, name, out, amp):
    """The summary's start and wait of each bucket against the printed ops (see 1. above)."""
    ops = mt.program_ops(out)
    rows = re.findall(r"bucket (\d+): .*\n\s+starts at op (\d+), after op (\d+) \(\w+\); waited for at op (\d+);", out)
    wrong = []
    for bucket, start, after, wait in ((int(a), int(b), int(x), int(w)) for a, b, x, w in rows):
        s, w = ops.get(start), ops.get(wait)
        if not (s and s.type == "c_allreduce_start" and s.attr("bucket") == str(bucket)):
            wrong.append(f"bucket {bucket}: op {start} is not its start")
            continue
        if not (w and w.type == "c_allreduce_wait" and w.attr("bucket") == str(bucket)):
            wrong.append(f"bucket {bucket}: op {wait} is not its wait")
            continue
        between = [ops[k].type for k in range(after + 1, start)]
        if any(t != "c_allreduce_start" for t in between) or not ops[after].outputs().keys() & s.inputs():
            wrong.append(f"bucket {bucket}: op {after} ({ops[after].type}) does not write its last gradient")
        if amp:
            u = ops.get(wait + 1)
            if not (u and u.type in ("check_finite_and_unscale", "cast_check_finite_and_unscale")
                    and w.outputs().keys() & u.inputs()):
                wrong.append(f"bucket {bucket}: op {wait + 1} is not the unscale of its wait's gradients")
    c.check(rows and not wrong, f"{name}: each of the {len(rows)} buckets starts after its last gradient, is waited "
                                f"for where the summary says{', and unscaled right after its wait' if amp else ''}",
            "; ".join(wrong[:4]) if wrong else f"{len(rows)} summary rows, {len(ops)} ops")


def train(c, d, name, args, np):
    path = d / f"{name}.safetensors"
    r = mt.mixtrain([*args, "--save", path], np=np, timeout=300)
    if not c.ok_run(r, f"{name} ({np} ranks)"):
        return None
    return mt.parameters_only(mt.load_checkpoint(path)[0])


def same_params(a, b):
    return a is not None and b is not None and a.keys() == b.keys() and all(mt.bit_identical(a[k], b[k]) for k in a)


def main():
    mt.require_mixtrain()
    mt.require_mpirun()
    c = mt.Checks("overlap")
    d = mt.workdir("overlap")
    mlp = [*mt.synthetic(size=512, features=48, classes=6, hidden=(40, 24)), "--batch-size", 16, "--eval", "false",
           "--seed", 3, "--steps", STEPS, "--bucket-mb", 0.001]
    resnet = ["--model", "resnet-small", "--data", "synthetic", "--synthetic-size", 64, "--batch-size", 4,
              "--eval", "false", "--seed", 3, "--steps", STEPS, "--bucket-mb", 0.1, "--precision", "amp"]
    tied = ["--model", "transformer", "--data", "synthetic", "--layers", 2, "--d-model", 32, "--heads", 2,
            "--context", 16, "--vocab", 64, "--tie-weights", "--batch-size", 4, "--optimizer", "adamw",
            "--eval", "false", "--seed", 3, "--steps", STEPS, "--bucket-mb", 0.01, "--precision", "amp"]

    # ---- 1. overlap changes nothing in the result (2 ranks) -------------------------------------
    for name, args in (("mlp_fp32", [*mlp, "--precision", "fp32"]), ("mlp_amp", [*mlp, "--precision", "amp"]),
                       ("resnet_amp", resnet), ("transformer_tied_amp", tied)):
        r = mt.mixtrain([*args, "--print-program"], np=2, timeout=60)
        if c.ok_run(r, f"{name}: --print-program"):
            rows = bucket_summary(r.out)
            c.check(len(rows) >= 3 and any(inside for _, _, inside in rows),
                    f"{name}: several buckets, and some start inside backward", f"{rows}")
            if name in ("resnet_amp", "transformer_tied_amp"):
                c.check({dt for _, dt, _ in rows} == {"f16", "f32"}, f"{name}: FP16 and FP32 buckets", f"{rows}")
            check_placement(c, name, r.out, amp=name != "mlp_fp32")
        on = train(c, d, f"{name}_overlap", args, 2)
        off = train(c, d, f"{name}_no_overlap", [*args, "--no-overlap"], 2)
        c.check(same_params(on, off), f"{name}: overlap and --no-overlap save bit-identical parameters after "
                                      f"{STEPS} steps on 2 ranks")

    # ---- 2. 4 ranks, an odd number of buckets ---------------------------------------------------
    odd = None
    for mb in (0.002, 0.0015, 0.0025, 0.001):
        r = mt.mixtrain([*mlp, "--precision", "amp", "--bucket-mb", mb, "--print-program"], np=4, timeout=60)
        n = len(bucket_summary(r.out))
        if r.rc == 0 and n >= 3 and n % 2 == 1:
            odd = (mb, len(bucket_summary(r.out)))
            break
    c.check(odd is not None, "a bucket size that gives an odd number (>= 3) of buckets", f"{odd}")
    if odd:
        args = [*mlp, "--precision", "amp", "--bucket-mb", odd[0]]
        on = train(c, d, "odd_overlap", args, 4)
        off = train(c, d, "odd_no_overlap", [*args, "--no-overlap"], 4)
        c.check(on is not None, f"4 ranks, {odd[1]} buckets: the overlapped run ends (no deadlock)")
        c.check(same_params(on, off), f"4 ranks, {odd[1]} buckets: bit-identical to --no-overlap")

    # ---- 3. overflow provenance -----------------------------------------------------------------
    amp = [*mlp, "--precision", "amp"]
    for np_, spec, want_params, want_ranks in (
            (2, "4:1:fc2.weight", ["fc2.weight"], [1]),
            (4, "4:2:fc1.bias", ["fc1.bias"], [2]),
            (2, "4:0", None, [0]),
            (2, "4", None, [0, 1])):
        metrics = d / f"provenance_{np_}_{spec.replace(':', '_')}.jsonl"
        r = mt.mixtrain([*amp, "--inject-overflow", spec, "--metrics", metrics], np=np_, timeout=120)
        if not c.ok_run(r, f"--inject-overflow {spec} on {np_} ranks"):
            continue
        m = mt.Metrics(metrics)
        line = m.step(4)
        c.check(line["skipped"] is True, f"{spec}: step 4 is skipped")
        got_params, got_ranks = line.get("overflow_params"), line.get("overflow_ranks")
        if want_params is None:  # every parameter, named once each
            init = d / "init.safetensors"
            if not init.exists():
                mt.mixtrain([*amp, "--steps", 0, "--save", init]).expect_ok()
            names = sorted(mt.parameters_only(mt.load_checkpoint(init)[0]))
            c.check(sorted(got_params or []) == names, f"{spec}: overflow_params names every parameter",
                    f"{got_params}")
        else:
            c.check(got_params == want_params, f"{spec}: overflow_params == {want_params}", f"{got_params}")
        c.check(got_ranks == want_ranks, f"{spec}: overflow_ranks == {want_ranks}", f"{got_ranks}")
        others = [s["step"] for s in m.steps if s["step"] != 4 and ("overflow_params" in s or s["skipped"])]
        c.check(not others, f"{spec}: no other step is skipped or names an overflow", f"{others}")
        if want_params:
            rank_word = "rank" if len(want_ranks) == 1 else "ranks"
            text = f"{want_params[0]} ({rank_word} {', '.join(map(str, want_ranks))})"
            c.check(text in r.out, f"{spec}: rank 0's log names '{text}'",
                    next((l for l in r.out.splitlines() if "overflowed" in l), r.out[-300:]))
    return c.finish()


if __name__ == "__main__":
    sys.exit(main())
