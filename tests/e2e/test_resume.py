"""Resume is exact: 10 steps in one run equal 6 steps, --save, then --resume to
step 10, bit for bit (parameters, optimizer state and the scaler's metadata),
for AMP with momentum and for AdamW, on 1 rank and on 2 ranks."""
import os
import sys

import mixtest

SMALL = ["--data", "synthetic", "--synthetic-size", "1024", "--synthetic-features", "32", "--hidden", "16",
         "--batch-size", "32", "--eval", "false", "--lr", "0.05"]


def main():
    checks = mixtest.Checks("resume")
    tmp = mixtest.workdir("resume")
    for ranks in (1, 2):
        for opt in (["--optimizer", "momentum"], ["--optimizer", "adamw", "--lr", "0.002"]):
            # A small incr interval makes the scaler's counters move during the run.
            common = SMALL + opt + ["--precision", "amp", "--incr-every-n-steps", "4"]
            full, part, resumed = (os.path.join(tmp, n) for n in ("full.st", "part.st", "resumed.st"))
            mixtest.mixtrain(common + ["--steps", "10", "--save", full], np=ranks).expect_ok()
            mixtest.mixtrain(common + ["--steps", "6", "--save", part], np=ranks).expect_ok()
            mixtest.mixtrain(common + ["--steps", "10", "--resume", part, "--save", resumed], np=ranks).expect_ok()
            a, meta_a = mixtest.load_checkpoint(full)
            b, meta_b = mixtest.load_checkpoint(resumed)
            bad = [k for k in sorted(set(a) | set(b)) if k not in a or k not in b or a[k].tobytes() != b[k].tobytes()]
            bad += [f"metadata {k}" for k in ("loss_scale", "scaler_good_steps", "scaler_bad_steps", "step")
                    if meta_a.get(k) != meta_b.get(k)]
            checks.check(not bad, f"{ranks} rank(s), {opt[1]}: 10 steps == 6 + resume 4, {len(a)} tensors "
                                  f"bit-identical (scale {meta_a.get('loss_scale')})", f"differing: {bad}")
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
