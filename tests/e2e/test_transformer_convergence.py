#!/usr/bin/python3
"""A short version of `scripts/convergence.sh --model transformer` that CI can
afford: the same model (4 layers, d_model 128, 4 heads, context 128, byte-level
fortunes text), 2 ranks x 16 sequences, AdamW with warm-up and a cosine schedule,
for STEPS steps instead of 1500, in AMP (FP16 all-reduce) and in FP32; the
validation loss is taken over the first EVAL_BATCHES batches of each rank's
share of the validation split.

Bars (nats per byte; a model that learnt nothing sits at ln 256 = 5.55, one
that learnt only byte frequencies near 3.3):
  - AMP validation loss <= BAR;
  - AMP within MAX_REL of FP32 (relative);
  - no skipped step.
Measured on the 2-core CI machine (deterministic for a given machine and seed):
AMP 2.638 and FP32 2.637 nats/byte after 150 steps. BAR leaves room for other
BLAS builds while staying far below the byte-frequency level; MAX_REL allows
for a short run's noise (the full 1500-step runs must hold AMP within 2%).
"""
import sys

import mixtest as mt

STEPS = 150
EVAL_BATCHES = 8
BAR = 2.9
MAX_REL = 0.03


def main():
    mt.require_mixtrain()
    mt.require_mpirun()
    c = mt.Checks("transformer_convergence")
    d = mt.workdir("transformer_convergence")
    val = {}
    for precision in ("amp", "fp32"):
        met = d / f"{precision}.jsonl"
        r = mt.mixtrain(["--model", "transformer", "--layers", 4, "--d-model", 128, "--heads", 4, "--context", 128,
                         "--data", "fortunes", "--precision", precision, "--steps", STEPS, "--batch-size", 16,
                         "--optimizer", "adamw", "--lr", "2e-3", "--weight-decay", "0.1", "--lr-schedule", "cosine",
                         "--warmup-steps", 30, "--eval-every", STEPS, "--eval-batches", EVAL_BATCHES,
                         "--log-every", 50, "--metrics", met], np=2, timeout=900)
        if not c.ok_run(r, f"transformer, {precision}, 2 ranks, {STEPS} steps"):
            continue
        s = mt.Metrics(met).summary
        val[precision] = s["val_loss"]
        print(f"{precision}: validation loss {val[precision]:.4f} nats/byte, {s['skipped_steps']} skipped steps, "
              f"{s['tokens_per_s_overall']:.0f} tokens/s")
        c.check(s["skipped_steps"] == 0, f"{precision}: no skipped steps", f"{s['skipped_steps']}")
    if "amp" in val:
        c.check(val["amp"] <= BAR, f"AMP validation loss <= {BAR} nats/byte", f"{val['amp']:.4f}")
    if len(val) == 2:
        rel = val["amp"] / val["fp32"] - 1
        c.check(rel <= MAX_REL, f"AMP within {100 * MAX_REL:.0f}% of FP32",
                f"AMP {val['amp']:.4f}, FP32 {val['fp32']:.4f} ({100 * rel:+.2f}%)")
    c.finish()


if __name__ == "__main__":
    sys.exit(main())
