#!/usr/bin/python3
"""--skip-loss-zscore Z and --skip-grad-norm-zscore Z skip an outlier update on every rank.

MIX_TEST_LOSS_SPIKE=140 (a testing aid in launch/trainer.cc) multiplies every
rank's inputs by 1000 at step 140: the loss and the gradients jump. FP32 on 2
ranks, so no overflow mixes in. Checks:
  1. with --skip-loss-zscore 3: step 140's line says outlier, skipped, not
     found_inf, with loss_z > 3; no other step is skipped (the window of 128
     steps is full from step 129 on, and the steps before have no loss_z);
     the summary counts outlier_skips 1; and the checkpoint after step 140 is
     bit-identical to the one after step 139 (every parameter and optimizer
     slot, optimizer.step included: the update did not happen; the run's last
     consistency check compares every rank's masters, so all ranks skipped);
  2. --skip-grad-norm-zscore 3 catches the same step from grad_norm;
  3. without either flag the spike is trained on: the checkpoint after step 140
     differs from the one after step 139;
  4. --cuda-graph with an outlier flag is refused (exit 2).
"""
import mixtest as mt

ARGS = [*mt.synthetic(size=512, features=32, classes=5, hidden=(16,)), "--precision", "fp32", "--batch-size", 16,
        "--eval", "false", "--check-every", 20]
SPIKE = {"MIX_TEST_LOSS_SPIKE": "140"}


def run(c, d, name, steps, flags=()):
    r = mt.mixtrain([*ARGS, "--steps", steps, *flags, "--metrics", d / f"{name}.jsonl",
                     "--save", d / f"{name}.safetensors"], np=2, timeout=180, env=SPIKE)
    if not c.ok_run(r, name):
        return None, None
    return mt.Metrics(d / f"{name}.jsonl"), mt.load_checkpoint(d / f"{name}.safetensors")[0]


def same(a, b):
    return sorted(a) == sorted(b) and all(mt.bit_identical(a[k], b[k]) for k in a)


def main():
    c = mt.Checks("outlier_skip")
    d = mt.workdir("outlier_skip")
    for flag in ("--skip-loss-zscore", "--skip-grad-norm-zscore"):
        z = "loss_z" if flag == "--skip-loss-zscore" else "grad_norm_z"
        m139, t139 = run(c, d, f"{z}_139", 139, [flag, 3])
        m140, t140 = run(c, d, f"{z}_140", 140, [flag, 3])
        if not (m140 and t139):
            continue
        s = m140.step(140)
        c.check(s["outlier"] and s["skipped"] and not s["found_inf"] and s.get(z, 0) > 3,
                f"{flag} 3: step 140 skipped as an outlier", str({k: s.get(k) for k in ("outlier", "skipped", z)}))
        others = [x["step"] for x in m140.steps if x["skipped"] and x["step"] != 140]
        c.check(not others, f"{flag}: no other step skipped", str(others))
        c.check(all(z not in x for x in m140.steps if x["step"] <= 128) and all(z in x for x in m140.steps
                                                                                if x["step"] > 128),
                f"{flag}: no {z} until the window of 128 steps is full")
        c.check(m140.summary["outlier_skips"] == 1 and m140.summary["skipped_steps"] == 0,
                "the summary counts one outlier skip and no overflow")
        c.check(same(t139, t140), f"{flag}: the state after step 140 is the state after step 139, bit for bit")

    r139, t139 = run(c, d, "plain_139", 139)
    r140, t140 = run(c, d, "plain_140", 140)
    if t139 and t140:
        c.check(not same(t139, t140) and not r140.step(140)["skipped"] and "outlier" not in r140.step(140),
                "without the flags the spike is trained on")
    r = mt.mixtrain([*ARGS, "--steps", 2, "--skip-loss-zscore", 3, "--cuda-graph"], timeout=30)
    c.check(r.rc == 2 and "--cuda-graph" in r.stderr, "--cuda-graph with --skip-loss-zscore: exit 2", r.describe(300))
    c.finish()


if __name__ == "__main__":
    main()
