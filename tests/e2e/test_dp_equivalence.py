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
wrong examples) shows the comparison can fail. With --shuffle true too (over two
epochs), and the second epoch is a new order of the same examples.
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

    check_shuffled(c, d)
    c.finish()


def check_shuffled(c, d):
    """With --shuffle true the permutation depends on (seed, epoch) only, so W ranks still
    split the one-rank batch between them; a rank shuffling with a seed of its own would
    not. Two epochs of 256 examples (16 steps of 32): the second epoch's order counts too,
    and it is a new one (with a learning rate too small to move a parameter, the per-step
    losses show the batches: the same examples each epoch, in another order)."""
    shuffled = ["--precision", "fp32", *mt.synthetic(size=256, features=32, classes=5, hidden=(32, 16)),
                "--shuffle", "true", "--eval", "false", "--seed", "3", "--optimizer", "sgd", "--steps", 16]
    got = {}
    for world in (1, 2):
        ckpt = d / f"shuffled_{world}.safetensors"
        r = mt.mixtrain([*shuffled, "--lr", "0.1", "--batch-size", BATCH // world, "--save", ckpt], np=world,
                        timeout=120)
        if c.ok_run(r, f"shuffled: {world} rank(s) x batch {BATCH // world}, 2 epochs"):
            got[world] = mt.load_checkpoint(ckpt)[0]
    if len(got) == 2:
        worst = max(mt.rel_diff(got[1][k], got[2][k]) for k in mt.parameters_only(got[1]))
        c.check(worst <= TOL, f"shuffled: 2 ranks x {BATCH // 2} == 1 rank x {BATCH} over 2 epochs, to {TOL:g}",
                f"worst rel diff {worst:.2e}")
    per_epoch = {}
    for shuffle in ("true", "false"):
        met = d / f"still_{shuffle}.jsonl"
        args = [*shuffled, "--shuffle", shuffle, "--lr", "1e-30", "--batch-size", BATCH, "--metrics", met]
        if c.ok_run(mt.mixtrain(args), f"--shuffle {shuffle}, lr 1e-30: per-step losses of 2 epochs"):
            steps = mt.Metrics(met).steps
            losses = np.array([s["loss"] for s in steps])
            per_epoch[shuffle] = (losses[:8], losses[8:])
            epochs = [s["epoch"] for s in steps]
            c.check(epochs == [0] * 8 + [1] * 8, f"--shuffle {shuffle}: step lines name epochs 0 and 1, 8 steps each",
                    f"{epochs}")
    if "true" in per_epoch and "false" in per_epoch:
        (a, b), (pa, pb) = per_epoch["true"], per_epoch["false"]
        # Same examples, unchanged parameters: each epoch's mean batch loss is the data set's mean.
        c.check(abs(a.mean() - b.mean()) <= 1e-5 * abs(a.mean()), "shuffled: both epochs see the same examples",
                f"mean loss {a.mean():.7g} vs {b.mean():.7g}")
        c.check(mt.rel_diff(a, b) > 1e-3, "shuffled: the second epoch's batches are not the first's (reshuffled)",
                f"epoch 1 {a.round(5).tolist()}, epoch 2 {b.round(5).tolist()}")
        c.check(mt.rel_diff(pa, pb) <= 1e-6, "control, --shuffle false: both epochs' batches are the same",
                f"epoch 1 {pa.round(5).tolist()}, epoch 2 {pb.round(5).tolist()}")


if __name__ == "__main__":
    sys.exit(main())
