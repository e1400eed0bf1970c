"""--resume refuses checkpoints it cannot continue from, naming the file and
what to do: one without `step` metadata (what a plain safetensors.save_file
writes) and one whose optimizer state holds inf or NaN; --init-from takes the
parameters of both and leaves their optimizer state aside."""
import math

import mixtest

SMALL = ["--data", "synthetic", "--synthetic-size", "256", "--synthetic-features", "16", "--hidden", "8",
         "--batch-size", "32", "--eval", "false", "--optimizer", "momentum", "--check-every", "0"]


def main():
    mixtest.require_mixtrain()
    checks = mixtest.Checks("resume refusals")
    tmp = mixtest.workdir("resume_refusals")
    good = tmp / "good.safetensors"
    checks.ok_run(mixtest.mixtrain(SMALL + ["--steps", "4", "--save", good]), "a checkpoint after 4 steps")
    tensors, meta = mixtest.load_checkpoint(good)
    checks.check(any(k.startswith("optimizer.momentum_buffer.") for k in tensors), "it holds optimizer state")

    # Without its step (a plain safetensors file): --resume would start "at step 0" with step 4's momentum.
    plain = tmp / "plain.safetensors"
    mixtest.safetensors_io.save(plain, tensors, {})
    r = mixtest.mixtrain(SMALL + ["--steps", "8", "--resume", plain])
    checks.check(r.rc == 2 and "has no 'step' in its metadata" in r.out and f"--init-from {plain}" in r.out,
                 "--resume of a file without step metadata is refused, pointing at --init-from", r.out[-400:])
    r = mixtest.mixtrain(SMALL + ["--steps", "8", "--init-from", plain])
    checks.ok_run(r, "--init-from of the same file")

    # inf in the optimizer state (momentum): every later step would be NaN.
    for bad_value in (math.inf, math.nan):
        broken = dict(tensors)
        name = next(k for k in tensors if k.startswith("optimizer.momentum_buffer."))
        arr = broken[name].copy()
        arr.flat[0] = bad_value
        broken[name] = arr
        path = tmp / f"broken_{bad_value}.safetensors"
        mixtest.safetensors_io.save(path, broken, meta)
        r = mixtest.mixtrain(SMALL + ["--steps", "8", "--resume", path])
        checks.check(r.rc != 0 and f"optimizer state '{name}' holds {'inf' if math.isinf(bad_value) else 'nan'}"
                     in r.out and "element 0" in r.out,
                     f"--resume of a checkpoint whose optimizer state holds {bad_value} is refused, naming it",
                     r.out[-400:])
        r = mixtest.mixtrain(SMALL + ["--steps", "8", "--init-from", path])
        checks.ok_run(r, f"--init-from takes its parameters and leaves the {bad_value} momentum aside")
    checks.finish()


if __name__ == "__main__":
    main()
