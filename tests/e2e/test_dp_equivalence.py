#!/usr/bin/python3
"""Data parallelism computes the large-batch step: in FP32, W ranks x batch B/W
give the parameters that 1 rank x batch B gives, for SGD and for momentum.

Why the runs see the same examples: with --shuffle false, DistributedSampler
(runtime/data/sampler.cc) gives rank r the positions r, r+W, r+2W, ... of the
epoch, and rank r's step k takes its positions [k*b, (k+1)*b). So at step k the
W ranks of batch b together hold the examples [k*W*b, (k+1)*W*b): exactly the
batch of step k of one rank with batch W*b. Each rank's loss is the mean over
its b examples and the gradient all-reduce divides by W (--grad-predivide
defaults to W), so the reduced gradient is the mean over all W*b examples: the
same gradient, summed in another order.

Tolerance 1e-5 relative (max |a-b| / max |a| per tensor): the only difference is
the order of the FP32 sums (per-rank partial sums, then the all-reduce), a few
ulps (~1e-7) per step, compounding over 10 steps; a wrong shard, a missing
division or a wrong scale is off by >= 1e-2. A negative control (ranks fed the
wrong examples) shows the comparison can fail.
"""
import sys

import numpy as np

import mixtest as mt

TOL = 1e-5
STEPS = 10
BATCH = 32  # the global batch of every comparison


def main():
    mt.require_mixtrain()
    mt.require_mpirun()
    c = mt.Checks("dp_equivalence")
    d = mt.workdir("dp_equivalence")
    base = ["--precision", "fp32", *mt.synthetic(size=1024, features=32, classes=5, hidden=(32, 16)),
            "--shuffle", "false", "--eval", "false", "--lr", "0.1", "--seed", "3"]

    init = d / "init.safetensors"
    if not c.ok_run(mt.mixtrain([*base, "--steps", 0, "--save", init]), "initial parameters"):
        c.finish()
    init_params, _ = mt.load_checkpoint(init)

    for opt in (["--optimizer", "sgd"], ["--optimizer", "momentum", "--momentum", "0.9"]):
        name = opt[1]
        runs = {}
        for world in (1, 2, 4):
            ckpt, met = d / f"{name}_{world}.safetensors", d / f"{name}_{world}.jsonl"
            r = mt.mixtrain([*base, *opt, "--steps", STEPS, "--batch-size", BATCH // world, "--save", ckpt,
                             "--metrics", met], np=world, timeout=120)
            if c.ok_run(r, f"{name}: {world} rank(s) x batch {BATCH // world}"):
                runs[world] = (mt.load_checkpoint(ckpt)[0], mt.Metrics(met))
        if 1 not in runs:
            continue
        ref, ref_metrics = runs[1]
        moved = max(mt.rel_diff(init_params[k], ref[k]) for k in mt.parameters_only(ref))
        c.check(moved > 100 * TOL, f"{name}: training moved the parameters far beyond the tolerance",
                f"max relative change {moved:.2e}")
        for world, (got, got_metrics) in sorted(runs.items()):
            if world == 1:
                continue
            print(f"{name}: {world} ranks x {BATCH // world} vs 1 rank x {BATCH}, after {STEPS} steps:")
            c.check(set(got) == set(ref), f"{name} world {world}: same tensors in the checkpoint",
                    f"{sorted(set(got) ^ set(ref))}")
            worst = 0.0
            for k in sorted(ref):
                if k not in got:
                    continue
                diff = mt.rel_diff(ref[k], got[k])
                worst = max(worst, diff)
                c.check(diff <= TOL, f"{name} world {world}: {k} {list(ref[k].shape)} agrees to {TOL:g} relative",
                        f"rel diff {diff:.2e}")
            # The logged loss is the mean over ranks of each rank's mean: the mean over the global batch.
            la = np.array([s["loss"] for s in ref_metrics.steps])
            lb = np.array([s["loss"] for s in got_metrics.steps])
            ld = mt.rel_diff(la, lb) if la.shape == lb.shape else float("inf")
            c.check(la.shape == lb.shape and ld <= TOL, f"{name} world {world}: per-step losses agree",
                    f"{len(la)} vs {len(lb)} steps, rel diff {ld:.2e}")
            print(f"  worst parameter difference {worst:.2e} (tolerance {TOL:g})")

    # Negative control: 2 ranks x 16 that are NOT the 1 x 32 examples (each rank
    # a full batch of 32 of its own shard) must differ, so the comparison has teeth.
    ctrl = d / "control.safetensors"
    r = mt.mixtrain([*base, "--optimizer", "sgd", "--steps", STEPS, "--batch-size", BATCH, "--save", ctrl], np=2)
    if c.ok_run(r, "control: 2 ranks x batch 32") and (d / "sgd_1.safetensors").exists():
        a, b = mt.load_checkpoint(d / "sgd_1.safetensors")[0], mt.load_checkpoint(ctrl)[0]
        diff = max(mt.rel_diff(a[k], b[k]) for k in mt.parameters_only(a))
        c.check(diff > 100 * TOL, "control: other examples give parameters outside the tolerance", f"{diff:.2e}")
    c.finish()


if __name__ == "__main__":
    sys.exit(main())
