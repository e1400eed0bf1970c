#!/usr/bin/python3
"""--grad-accum-steps K: K micro-batches of --batch-size make one optimizer step.

Checks (synthetic data in a fixed order, --shuffle false, so that the same
examples make each step whichever way they are split):
  1. FP32, one rank: K=4 x B=8 trains as B=32 (SGD and AdamW, 5 steps):
     every parameter and optimizer slot within 1e-5 of the other run's largest
     value, and the same loss each step (the mean of the micro-batches');
  2. FP32, 2 ranks x K=2 x B=8 trains as 1 rank x B=32 (rank r reads the
     positions r, r+2, ...: the same 32 examples a step);
  3. AMP on 2 ranks: grad_bytes per optimizer step is the same with K=4 as with
     K=1, and exactly 2 bytes a parameter (the FP16 gradients, all-reduced once a
     step, during the last micro-batch's backward);
  4. an overflow injected into micro-batch 2 of step 3 on rank 1
     (--inject-overflow 3.2:1) skips step 3 on every rank: the run's state after
     step 3 is, bit for bit, the state after step 2 (parameters and optimizer
     slots; the loss scale's counters count the skip), and step 4 trains again;
  5. --resume of a K=4 checkpoint with K=2 is refused (exit 2, naming
     --grad-accum-steps 4); with K=4 it ends with the bits of a run that never
     stopped;
  6. --print-program lists the accumulation pass, "off" when K is 1, and the
     program has one grad_accumulate "finish" right before each bucket's start
     (one rank, --no-elide-single-rank-sync; test_single_rank_sync.py trains
     with and without it);
  7. the summary counts micro_batches; a K above an epoch's micro-batches, and
     --cuda-graph with K > 1, are refused with exit 2.
"""
import mixtest as mt

DATA = [*mt.synthetic(size=512, features=32, classes=5, hidden=(16,)), "--shuffle", "false", "--eval", "false"]


def run(c, d, name, args, np=1):
    r = mt.mixtrain([*DATA, *args, "--metrics", d / f"{name}.jsonl", "--save", d / f"{name}.safetensors"], np=np,
                    timeout=180)
    if not c.ok_run(r, name):
        return None, None
    metrics = d / f"{name}.jsonl"  # none with --steps 0
    return mt.Metrics(metrics) if metrics.exists() else None, mt.load_checkpoint(d / f"{name}.safetensors")[0]


def same_training(c, what, a, b, tol):
    """Every tensor of checkpoint b within tol of a (relative to a's largest value), and the same losses."""
    (ma, ta), (mb, tb) = a, b
    if ta is None or tb is None:
        return
    worst = max(mt.rel_diff(ta[k], tb[k]) for k in ta)
    c.check(sorted(ta) == sorted(tb) and worst <= tol, f"{what}: every tensor within {tol:g}", f"worst {worst:.2e}")
    la = [s["loss"] for s in ma.steps]
    lb = [s["loss"] for s in mb.steps]
    loss_worst = max(abs(x - y) / abs(x) for x, y in zip(la, lb)) if la else 1
    c.check(len(la) == len(lb) and loss_worst <= tol, f"{what}: the same loss each step", f"worst {loss_worst:.2e}")


def main():
    c = mt.Checks("grad_accum")
    d = mt.workdir("grad_accum")
    fp32 = ["--precision", "fp32", "--lr", "0.1", "--steps", 5]

    # 1 and 2. FP32 equivalence. 1e-5: the sums differ only in FP32 rounding
    # (4 partial sums of 8 against one of 32), ~1e-7 of the values here.
    for opt in ("sgd", "adamw"):
        flags = [*fp32, "--optimizer", opt] + (["--lr", "0.01"] if opt == "adamw" else [])
        whole = run(c, d, f"{opt}_b32", [*flags, "--batch-size", 32])
        split = run(c, d, f"{opt}_k4", [*flags, "--batch-size", 8, "--grad-accum-steps", 4])
        same_training(c, f"{opt}: K=4 x B=8 against B=32, one rank", whole, split, 1e-5)
        if opt == "sgd":
            ranks = run(c, d, "sgd_2x_k2", [*flags, "--batch-size", 8, "--grad-accum-steps", 2], np=2)
            same_training(c, "sgd: 2 ranks x K=2 x B=8 against 1 rank x B=32", whole, ranks, 1e-5)
            if split[0]:
                c.check(split[0].summary["micro_batches"] == 20 and whole[0].summary["micro_batches"] == 5,
                        "the summary counts micro_batches (K x steps)",
                        f"{split[0].summary['micro_batches']}, {whole[0].summary['micro_batches']}")

    # 3. The gradient bytes of a step do not depend on K.
    amp = ["--precision", "amp", "--steps", 4, "--batch-size", 8]
    params = run(c, d, "init", ["--steps", 0])[1]
    n = sum(v.size for k, v in params.items() if not k.startswith("optimizer.")) if params else 0
    k1, _ = run(c, d, "amp_k1", amp, np=2)
    k4, _ = run(c, d, "amp_k4", [*amp, "--grad-accum-steps", 4], np=2)
    if k1 and k4:
        b1 = [s["grad_bytes"] for s in k1.steps]
        b4 = [s["grad_bytes"] for s in k4.steps]
        c.check(b1 == b4 and set(b4) == {2 * n}, "grad_bytes a step: the same with K=4 as K=1, 2 bytes a parameter",
                f"K=1 {b1}, K=4 {b4}, {n} parameters")

    # 4. An overflow in one micro-batch on one rank skips the whole step everywhere.
    base = [*amp, "--grad-accum-steps", 4]
    two, t2 = run(c, d, "amp_two_steps", [*base, "--steps", 2], np=2)
    hit, t3 = run(c, d, "amp_hit", [*base, "--steps", 3, "--inject-overflow", "3.2:1"], np=2)
    if hit and t2 and t3:
        s3 = hit.step(3)
        c.check(s3["skipped"] and not hit.step(2)["skipped"] and s3["overflow_ranks"] == [0, 1],
                "micro-batch 2 of step 3 on rank 1: step 3 skipped on every rank", str(s3))
        c.check(sorted(t2) == sorted(t3) and all(mt.bit_identical(t2[k], t3[k]) for k in t2),
                "the skipped step leaves every parameter and optimizer slot as after step 2")
        c.check(hit.summary["skipped_steps"] == 1, "one skipped step in the summary")
    more, _ = run(c, d, "amp_hit_then_more", [*base, "--steps", 5, "--inject-overflow", "3.2:1"], np=2)
    if more:
        c.check(not more.step(4)["skipped"] and not more.step(5)["skipped"], "the steps after it train")

    # 5. Resume: the same K continues exactly; another K is refused.
    full, tf = run(c, d, "resume_full", [*fp32, "--batch-size", 8, "--grad-accum-steps", 4, "--steps", 6])
    half, _ = run(c, d, "resume_half", [*fp32, "--batch-size", 8, "--grad-accum-steps", 4, "--steps", 3])
    if half:
        r = mt.mixtrain([*DATA, *fp32, "--batch-size", 8, "--grad-accum-steps", 2, "--steps", 6,
                         "--resume", d / "resume_half.safetensors"], timeout=60)
        c.check(r.rc == 2 and "--grad-accum-steps 4" in r.out,
                "--resume of a K=4 checkpoint with K=2: refused, naming --grad-accum-steps 4", r.describe(600))
        cont, tc = run(c, d, "resume_cont", [*fp32, "--batch-size", 8, "--grad-accum-steps", 4, "--steps", 6,
                                             "--resume", d / "resume_half.safetensors"])
        if cont and full:
            c.check(all(mt.bit_identical(tf[k], tc[k]) for k in tf), "--resume with K=4: the bits of the unbroken run")

    # 6. The pass and the program (one rank's all-reduces kept: elide_single_rank_sync
    # would take the starts out, leaving the finishes where they were put).
    r = mt.mixtrain([*DATA, "--batch-size", 8, "--grad-accum-steps", 4, "--no-elide-single-rank-sync",
                     "--print-program"], timeout=60)
    text = r.out
    ops = mt.program_ops(text)
    finish = [i for i, op in ops.items() if op.type == "grad_accumulate" and op.attr("mode") == '"finish"']
    starts = [i for i, op in ops.items() if op.type == "c_allreduce_start"]
    c.check(r.rc == 0 and "insert_grad_accumulation: gradients summed over 4 micro-batches" in text,
            "--print-program lists the accumulation pass", r.describe(300))
    c.check(bool(starts) and [s - 1 for s in starts] == finish, "a grad_accumulate finish right before each start",
            f"finish at {finish}, starts at {starts}")
    r1 = mt.mixtrain([*DATA, "--batch-size", 8, "--print-program"], timeout=60)
    c.check("(collective/grad_accumulation_pass.cc): off, --grad-accum-steps 1" in r1.out,
            "K=1: the pass is off, and says which flag would turn it on")

    # 7. Refusals.
    r = mt.mixtrain([*DATA, "--batch-size", 64, "--grad-accum-steps", 9, "--steps", 1], timeout=60)
    c.check(r.rc == 2 and "--grad-accum-steps 9" in r.out, "K above an epoch's 8 micro-batches: exit 2",
            r.describe(400))
    r = mt.mixtrain([*DATA, "--grad-accum-steps", 2, "--cuda-graph", "--steps", 1], timeout=60)
    c.check(r.rc == 2 and "--cuda-graph" in r.stderr, "--cuda-graph with K=2: exit 2 naming it", r.describe(400))
    c.finish()


if __name__ == "__main__":
    main()
