#!/usr/bin/python3
"""Every rank of an AMP job keeps bit-identical FP32 masters and scaler state,
and a run is deterministic.

Only rank 0 saves, so the per-rank comparison is mixtrain's own check:
--check-every 1 makes every rank all-gather, after every step, a fingerprint of
(step, FNV-1a hash of the bytes of every FP32 master, loss scale, good/bad/skipped
counters) and compare it with rank 0's (launch/trainer.cc consistency_check,
collective/consistency.cc check_same_on_all_ranks, which throws on every rank
together). The test
  1. runs 20 AMP steps on 2 and on 4 ranks with --check-every 1: the runs must
     succeed (all ranks agreed after every step);
  2. shows that a divergence is caught: with MIX_TEST_DIVERGE=STEP:RANK (a
     testing aid in launch/trainer.cc that nudges one master of that rank after
     that step, since every flag is fingerprinted at startup) the job stops at
     the next check, naming that rank alone and "fp32 masters": a middle rank of
     4 with --check-every 3, rank 1 of 2 with --check-every 1, and with
     --check-every 0 at the last step's check;
  3. runs each job twice: rank 0's checkpoints must be bit-identical files and
     the logged losses and loss scales identical.
"""
import sys

import mixtest as mt

STEPS = 20


def main():
    mt.require_mixtrain()
    mt.require_mpirun()
    c = mt.Checks("multirank_consistency")
    d = mt.workdir("multirank_consistency")
    base = ["--precision", "amp", *mt.synthetic(size=1024, features=32, classes=5, hidden=(32, 16)),
            "--batch-size", 16, "--steps", STEPS, "--eval", "false", "--seed", 5, "--lr", "0.05"]

    # ---- 1 and 3: agreement after every step, and determinism ----------------------------------
    for world in (2, 4):
        ckpts, metrics = [], []
        for rep in (1, 2):
            ckpt, met = d / f"w{world}_r{rep}.safetensors", d / f"w{world}_r{rep}.jsonl"
            r = mt.mixtrain([*base, "--check-every", 1, "--save", ckpt, "--metrics", met], np=world, timeout=120)
            if not c.ok_run(r, f"{world} ranks, AMP, {STEPS} steps, --check-every 1, run {rep}"):
                continue
            c.check("consistency check failed" not in r.out, f"{world} ranks run {rep}: no consistency failure logged")
            m = mt.Metrics(met)
            c.check(len(m.steps) == STEPS, f"{world} ranks run {rep}: {STEPS} step lines", f"{len(m.steps)}")
            ckpts.append(ckpt)
            metrics.append(m)
        if len(ckpts) != 2:
            continue
        same_file = ckpts[0].read_bytes() == ckpts[1].read_bytes()
        c.check(same_file, f"{world} ranks: two identical runs write byte-identical checkpoints",
                f"{ckpts[0].stat().st_size} bytes")
        (ta, ma), (tb, mb) = mt.load_checkpoint(ckpts[0]), mt.load_checkpoint(ckpts[1])
        differing = sorted(k for k in ta if k not in tb or not mt.bit_identical(ta[k], tb[k]))
        c.check(set(ta) == set(tb) and not differing, f"{world} ranks: every tensor bit-identical across runs",
                f"{len(ta)} tensors; differing: {differing}")
        c.check(ma == mb, f"{world} ranks: checkpoint metadata identical", f"{ma}")
        fields = ("loss", "loss_scale", "found_inf", "grad_bytes", "lr")
        la = [[s[f] for f in fields] for s in metrics[0].steps]
        lb = [[s[f] for f in fields] for s in metrics[1].steps]
        c.check(la == lb, f"{world} ranks: per-step {', '.join(fields)} identical across runs",
                f"final loss {metrics[0].steps[-1]['loss']:.6f}" if la else "")

    # ---- 2: a divergence is caught ------------------------------------------------------------
    # MIX_TEST_DIVERGE=STEP:RANK makes that rank's first master one float larger after STEP (a
    # testing aid: every flag is in the startup fingerprint, so no flag can make ranks diverge
    # later). The check after it, and only that one, must stop the whole job naming that rank
    # alone; with --check-every 0 the check at the last step still runs.
    div = ["--precision", "amp", *mt.synthetic(size=512, features=32, classes=5, hidden=(32, 16)),
           "--batch-size", 16, "--steps", 6, "--eval", "false"]
    for world, every, at, caught_at in ((4, 3, "4:2", 6), (2, 1, "2:1", 2), (2, 0, "2:1", 6)):
        rank = int(at.split(":")[1])
        r = mt.mixtrain([*div, "--check-every", every], np=world, timeout=60, env={"MIX_TEST_DIVERGE": at})
        what = f"{world} ranks, rank {rank} diverging after step {at.split(':')[0]}, --check-every {every}"
        c.check(not r.timed_out and r.rc not in (0, None), f"{what}: the job fails, no hang",
                f"exit {r.rc}, {r.seconds:.1f} s")
        others = [f"rank {k} differs" for k in range(1, world) if k != rank]
        named = (f"step {caught_at} consistency check failed" in r.out and f"rank {rank} differs" in r.out
                 and "fp32 masters" in r.out and not any(o in r.out for o in others))
        c.check(named, f"{what}: 'step {caught_at} consistency check failed' names rank {rank} alone", r.out[-700:])
    c.finish()


if __name__ == "__main__":
    sys.exit(main())
