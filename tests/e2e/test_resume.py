"""Resume is exact: 10 steps in one run equal 6 steps, --save, then --resume to
step 10, bit for bit (parameters, optimizer state and the scaler's metadata),
for AMP with momentum and for AdamW, on 1 rank and on 2 ranks; and a checkpoint
without the scaler's state starts the scaler at its initial scale."""
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
    # A checkpoint without the scaler's state (--steps 0 --save, or FP32 training) starts the
    # scaler afresh, at the initial scale the flags give, not at 1 (as it used to, silently:
    # FP16 gradients then underflow).
    init, fp32 = os.path.join(tmp, "init.st"), os.path.join(tmp, "fp32.st")
    mixtest.mixtrain(SMALL + ["--steps", "0", "--save", init]).expect_ok()
    mixtest.mixtrain(SMALL + ["--precision", "fp32", "--steps", "2", "--save", fp32]).expect_ok()
    for path, extra, want in ((init, [], 32768.0), (init, ["--init-loss-scaling", "1024"], 1024.0),
                              (fp32, [], 32768.0)):
        metrics = os.path.join(tmp, "fresh_scaler.jsonl")
        mixtest.mixtrain(SMALL + ["--precision", "amp", "--steps", "4", "--resume", path, "--metrics", metrics]
                         + extra).expect_ok()
        first = mixtest.Metrics(metrics).steps[0]
        checks.check(first["loss_scale"] == want and not first["skipped"],
                     f"--resume {os.path.basename(path)} {' '.join(extra)}: the scaler starts at {want}",
                     f"first step: {first}")
    # The largest FP32 scale survives the 9 digits the checkpoint writes (3.40282347e+38 is a
    # little above FLT_MAX as a double; the check used to compare it as one).
    flt_max = os.path.join(tmp, "flt_max.st")
    static = SMALL + ["--precision", "amp", "--loss-scaling", "static", "--init-loss-scaling", "3.4028234e38"]
    mixtrain = mixtest.mixtrain(static + ["--steps", "2", "--save", flt_max])
    if checks.ok_run(mixtrain, "static scale FP32's largest: checkpoint"):
        checks.ok_run(mixtest.mixtrain(static + ["--steps", "4", "--resume", flt_max]), "... and resume from it")
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
