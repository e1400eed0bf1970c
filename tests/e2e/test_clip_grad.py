#!/usr/bin/python3
"""--clip-grad-norm under AMP clips the unscaled gradients, and grad_norm is theirs.

(FP32 parity with torch.nn.utils.clip_grad_norm_ / clip_grad_value_ and
torch's total_norm: e2e.test_cli_parity. The ops: unit.test_clip_grad.)

On 2 ranks, MLP, synthetic data, AMP (loss scale 32768):
  1. every metrics line has grad_norm, and at step 1 it is the FP32 run's
     grad_norm to 1e-2 (the same weights and batch; the FP16 gradients round
     each element to 2^-11 relative, so their norm moves by about as much),
     not 32768 times it;
  2. --clip-grad-norm C with C between the unscaled norm and the scaled one
     (the test checks both) changes nothing: the checkpoint is bit-identical to
     the run without the clip. Clipping the scaled gradients would bite;
  3. --clip-grad-norm 1e-3, which bites every step, trains a different model,
     and each step's grad_norm is still the norm before the clip.
"""
import mixtest as mt

ARGS = [*mt.synthetic(size=256, features=32, classes=5, hidden=(16,)), "--batch-size", 16, "--steps", 4,
        "--eval", "false", "--shuffle", "false"]
SCALE = 32768.0


def run(c, d, name, flags):
    r = mt.mixtrain([*ARGS, *flags, "--metrics", d / f"{name}.jsonl", "--save", d / f"{name}.safetensors"], np=2,
                    timeout=120)
    if not c.ok_run(r, name):
        return None, None
    return mt.Metrics(d / f"{name}.jsonl"), mt.load_checkpoint(d / f"{name}.safetensors")[0]


def main():
    c = mt.Checks("clip_grad")
    d = mt.workdir("clip_grad")
    fp32, _ = run(c, d, "fp32", ["--precision", "fp32"])
    amp, t_amp = run(c, d, "amp", ["--precision", "amp"])
    if not (fp32 and amp):
        c.finish()
    norms = [s.get("grad_norm") for s in amp.steps]
    c.check(len(norms) == 4 and all(isinstance(n, float) and n > 0 for n in norms), "grad_norm on every AMP line",
            str(norms))
    n32 = fp32.step(1)["grad_norm"]
    n16 = amp.step(1)["grad_norm"]
    c.check(abs(n16 - n32) <= 1e-2 * n32, "AMP's grad_norm is the unscaled gradients' (FP32's to 1e-2)",
            f"AMP {n16}, FP32 {n32}")

    bound = 10 * max(norms)
    c.check(bound < SCALE * min(norms), "a C above every unscaled norm and below every scaled one",
            f"C {bound:.4g}, scaled norms from {SCALE * min(norms):.4g}")
    loose, t_loose = run(c, d, "amp_clip_loose", ["--precision", "amp", "--clip-grad-norm", bound])
    if loose:
        c.check(sorted(t_loose) == sorted(t_amp) and all(mt.bit_identical(t_amp[k], t_loose[k]) for k in t_amp),
                "--clip-grad-norm above the unscaled norm: bit-identical to no clip")
        c.check([s["grad_norm"] for s in loose.steps] == norms, "and the same grad_norm each step")

    tight, t_tight = run(c, d, "amp_clip_tight", ["--precision", "amp", "--clip-grad-norm", 1e-3])
    if tight:
        c.check(any(not mt.bit_identical(t_amp[k], t_tight[k]) for k in t_amp if not k.startswith("optimizer.step")),
                "--clip-grad-norm 1e-3 bites: another model")
        c.check(tight.step(1)["grad_norm"] == norms[0] and not any(s["skipped"] for s in tight.steps),
                "grad_norm is the norm before the clip; no step skipped")
    c.finish()


if __name__ == "__main__":
    main()
