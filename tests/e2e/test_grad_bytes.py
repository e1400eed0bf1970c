#!/usr/bin/python3
"""The FP16 gradient all-reduce moves half the bytes, and the program shows why.

On 2 ranks under AMP:
  1. grad_bytes (the payload this rank sent in gradient all-reduces per step,
     count * dtype size, collective/communicator.h) is exactly 2 * N for
     --grad-reduce fp16 and 4 * N for --grad-reduce fp32, N the number of
     parameter elements (counted from the `--steps 0 --save` checkpoint), on
     every step: the MLP's gradients are all FP16 under AMP (the biases follow
     the FP16 adds), so all of them travel in the FP16 buckets;
  2. --print-program in fp16 mode: a c_allreduce_start (traffic "gradients")
     packs fc1.weight.cast_fp16@GRAD into an f16 bucket, and the cast to FP32
     (fc1.weight@GRAD = cast_check_finite_and_unscale(X=[..., fc1.weight.cast_fp16@GRAD, ...]),
     the cast fused with the unscale) comes after the bucket's c_allreduce_wait;
     in fp32 mode a plain cast in backward comes first, the all-reduce moves
     fc1.weight@GRAD in an f32 bucket and no all-reduce touches the FP16
     gradient. The pre-division by the world size shows as prescale=0.5.
"""
import sys

import mixtest as mt

STEPS = 6
def main():
    mt.require_mixtrain()
    mt.require_mpirun()
    c = mt.Checks("grad_bytes")
    d = mt.workdir("grad_bytes")
    base = ["--precision", "amp", *mt.synthetic(size=512, features=48, classes=6, hidden=(40, 24)),
            "--batch-size", 16, "--eval", "false", "--seed", 2]

    init = d / "init.safetensors"
    if not c.ok_run(mt.mixtrain([*base, "--steps", 0, "--save", init]), "initial parameters"):
        c.finish()
    params = mt.parameters_only(mt.load_checkpoint(init)[0])
    n = int(sum(v.size for v in params.values()))
    print(f"{len(params)} parameters, {n} elements: {', '.join(f'{k}{list(v.shape)}' for k, v in params.items())}")

    per_step = {}
    for mode in ("fp16", "fp32"):
        met = d / f"{mode}.jsonl"
        r = mt.mixtrain([*base, "--steps", STEPS, "--grad-reduce", mode, "--metrics", met], np=2, timeout=90)
        if c.ok_run(r, f"2 ranks, --grad-reduce {mode}"):
            m = mt.Metrics(met)
            per_step[mode] = [s["grad_bytes"] for s in m.steps]
            c.check(m.summary and m.summary.get("grad_reduce") == mode, f"{mode}: the summary names the mode",
                    f"{m.summary and m.summary.get('grad_reduce')}")
    if "fp16" in per_step:
        c.check(per_step["fp16"] == [2 * n] * STEPS, f"fp16: grad_bytes = 2 * {n} = {2 * n} on every step",
                f"{per_step['fp16']}")
    if "fp32" in per_step:
        c.check(per_step["fp32"] == [4 * n] * STEPS, f"fp32: grad_bytes = 4 * {n} = {4 * n} on every step",
                f"{per_step['fp32']}")
    if len(per_step) == 2:
        c.check(all(2 * a == b for a, b in zip(per_step["fp16"], per_step["fp32"])) and per_step["fp16"],
                "fp16 sends exactly half the bytes of fp32", f"{per_step['fp16'][0]} vs {per_step['fp32'][0]}")

    # ---- the printed program ------------------------------------------------------------------
    for mode in ("fp16", "fp32"):
        r = mt.mixtrain([*base, "--grad-reduce", mode, "--print-program"], np=2, timeout=60)
        if not c.ok_run(r, f"--print-program, --grad-reduce {mode}"):
            continue
        ops = list(mt.program_ops(r.stdout).values())
        c.check(len(ops) > 10, f"{mode}: the program prints its ops", f"{len(ops)} ops")
        grad_ar = [op for op in ops if op.type == "c_allreduce_start" and op.attr("traffic") == '"gradients"']
        waits = [op for op in ops if op.type == "c_allreduce_wait" and op.attr("traffic") == '"gradients"']
        to_fp32 = "cast_check_finite_and_unscale" if mode == "fp16" else "cast"
        cast = [op for op in ops if op.type in ("cast", "cast_check_finite_and_unscale")
                and "fc1.weight@GRAD" in op.outputs()]
        c.check(len(cast) == 1 and cast[0].type == to_fp32, f"{mode}: one {to_fp32} produces fc1.weight@GRAD",
                f"{[(op.index, op.type) for op in cast]}")
        if len(cast) != 1:
            continue
        cast = cast[0]
        c.check("fc1.weight.cast_fp16@GRAD" in cast.inputs() and cast.outputs()["fc1.weight@GRAD"] == "f32",
                f"{mode}: it reads fc1.weight.cast_fp16@GRAD and writes f32", f"op {cast.index}")
        fp16_ar = [op for op in grad_ar if "fc1.weight.cast_fp16@GRAD" in op.inputs()]
        fp32_ar = [op for op in grad_ar if "fc1.weight@GRAD" in op.inputs()]
        bucket_dtypes = [dt for op in grad_ar for dt in op.outputs().values()]
        if mode == "fp16":
            ok = len(fp16_ar) == 1 and not fp32_ar
            c.check(ok, "fp16: the all-reduce consumes fc1.weight.cast_fp16@GRAD (and none fc1.weight@GRAD)",
                    f"{[op.index for op in fp16_ar]} / {[op.index for op in fp32_ar]}")
            if ok:
                ar = fp16_ar[0]
                c.check(list(ar.outputs().values()) == ["f16"], "fp16: it moves an f16 bucket", ar.outs_text)
                wait = [op for op in waits if "fc1.weight.cast_fp16@GRAD" in op.outputs()]
                c.check(len(wait) == 1 and ar.index < wait[0].index < cast.index,
                        "fp16: start, then wait, then the cast to FP32",
                        f"start op {ar.index}, wait {[op.index for op in wait]}, cast op {cast.index}")
                c.check(bucket_dtypes and all(dt == "f16" for dt in bucket_dtypes),
                        "fp16: every gradient bucket of this MLP is f16", f"{bucket_dtypes}")
                c.check(ar.attr("prescale") == "0.5", "fp16: pre-divided by the world size 2", ar.attrs)
        else:
            ok = len(fp32_ar) == 1 and not fp16_ar
            c.check(ok, "fp32: the all-reduce moves fc1.weight@GRAD (and none fc1.weight.cast_fp16@GRAD)",
                    f"{[op.index for op in fp32_ar]} / {[op.index for op in fp16_ar]}")
            if ok:
                ar = fp32_ar[0]
                c.check(list(ar.outputs().values()) == ["f32"], "fp32: it moves an f32 bucket", ar.outs_text)
                c.check(cast.index < ar.index, "fp32: the cast comes before the all-reduce",
                        f"cast op {cast.index}, all-reduce op {ar.index}")
        if mode == "fp16" and grad_ar:
            print("fp16 all-reduce:", " ".join(f"{op.index}: {op.type}({op.ins_text[:90]}...)" for op in grad_ar))
    c.finish()


if __name__ == "__main__":
    sys.exit(main())
