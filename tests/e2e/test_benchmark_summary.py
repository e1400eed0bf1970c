#!/usr/bin/python3
"""--benchmark reports what it says it reports.

One AMP run of the MLP with 2 warm-up steps and 4 timed ones:
  1. the summary's step_ms is the mean step_ms of the 4 timed step lines (the
     warm-up left out), its samples_per_s the mean of their samples_per_s,
     and samples_per_s_overall is their examples over their summed time; an
     overflow injected in the warm-up still counts in skipped_steps;
  2. host_queue_ms, the host's time to queue a step, is positive and no more
     than the step time (on the CPU the kernels run as they are queued, so it
     is nearly all of it; on a GPU it tells a host-bound step from a GPU-bound
     one);
  3. the printed benchmark line carries the same samples/s, names the 4 timed
     steps, and the GPU-only host-queue line is absent on the CPU;
  4. a ResNet prints images/s, and a Transformer tokens/s: its summary's
     tokens_per_s_overall is samples_per_s_overall times the context, and
     tokens_per_s samples_per_s times the context;
  5. peak_bytes on the CPU is training's: the same model and batch give the
     same peak on Fashion-MNIST (60,000 + 10,000 images held all run, 220 MB)
     as on 64 synthetic examples of its shape.
"""
import re
import sys

import mixtest as mt

BATCH, WARMUP, TIMED = 32, 2, 4  # --steps counts the timed steps; the warm-up comes on top


def main():
    c = mt.Checks("benchmark_summary")
    d = mt.workdir("benchmark_summary")
    met = d / "bench.jsonl"
    # An overflow in the warm-up: untimed, but skipped all the same.
    r = mt.mixtrain(["--data", "synthetic", "--synthetic-size", 512, "--synthetic-features", 32, "--hidden", 16,
                     "--precision", "amp", "--batch-size", BATCH, "--benchmark", "--benchmark-warmup", WARMUP,
                     "--steps", TIMED, "--inject-overflow", 1, "--metrics", met])
    if not c.ok_run(r, "an AMP MLP run with --benchmark"):
        return c.finish()
    m = mt.Metrics(met)
    s = m.summary
    c.check(len(m.steps) == WARMUP + TIMED and s["steps"] == WARMUP + TIMED,
            "the run has the warm-up steps and then the timed ones", f"{len(m.steps)} step lines")
    c.check(m.step(1)["skipped"] and s["skipped_steps"] == 1,
            "the warm-up's skipped step counts in skipped_steps (timed or not)", f"{s['skipped_steps']}")
    timed = [m.step(n)["step_ms"] for n in range(WARMUP + 1, WARMUP + TIMED + 1)]
    mean_ms = sum(timed) / len(timed)
    c.check(abs(s["step_ms"] - mean_ms) <= 1e-9 * mean_ms,
            "the summary's step_ms is the mean of the timed steps' step_ms", f"{s['step_ms']} vs {mean_ms}")
    expected_sps = BATCH * len(timed) / (sum(timed) / 1e3)
    c.check(abs(s["samples_per_s_overall"] - expected_sps) <= 1e-9 * expected_sps,
            "samples_per_s_overall is the timed steps' examples over their time",
            f"{s['samples_per_s_overall']} vs {expected_sps}")
    # The summary's samples_per_s: the mean of the timed step lines' rates.
    rates = [m.step(n)["samples_per_s"] for n in range(WARMUP + 1, WARMUP + TIMED + 1)]
    mean_rate = sum(rates) / len(rates)
    c.check(abs(s["samples_per_s"] - mean_rate) <= 1e-9 * mean_rate,
            "the summary's samples_per_s is the mean of the timed steps' samples_per_s",
            f"{s['samples_per_s']} vs {mean_rate}")
    c.check(0 < s["host_queue_ms"] <= s["step_ms"], "0 < host_queue_ms <= step_ms",
            f"{s['host_queue_ms']} ms of {s['step_ms']} ms")
    line = re.search(r"benchmark: mlp amp batch 32 x 1 ranks: ([0-9.e+]+) samples/s over (\d+) timed steps", r.out)
    c.check(bool(line) and int(line.group(2)) == len(timed)
            and abs(float(line.group(1)) - s["samples_per_s_overall"]) <= 1e-4 * s["samples_per_s_overall"],
            "the benchmark line prints the summary's samples/s over the 4 timed steps",
            line.group(0) if line else r.out[-400:])
    c.check("to queue a" not in r.out, "no host-queue line on the CPU, where it would say nothing")

    # ---- 4. the units of the other models ----
    r = mt.mixtrain(["--model", "resnet-small", "--width", 4, "--blocks", "1,1", "--image-size", 16, "--data",
                     "synthetic", "--synthetic-size", 16, "--batch-size", 4, "--benchmark", "--benchmark-warmup", 1,
                     "--steps", 2])
    if c.ok_run(r, "resnet-small with --benchmark"):
        c.check(re.search(r"benchmark: resnet-small amp batch 4 x 1 ranks: [0-9.e+]+ images/s over 2 timed", r.out)
                is not None, "a ResNet's benchmark line counts images/s", r.out[-300:])
    context = 16
    met = d / "transformer.jsonl"
    r = mt.mixtrain(["--model", "transformer", "--layers", 1, "--d-model", 16, "--heads", 2, "--context", context,
                     "--vocab", 32, "--data", "synthetic", "--batch-size", 4, "--benchmark", "--benchmark-warmup", 1,
                     "--steps", 2, "--metrics", met])
    if c.ok_run(r, "a Transformer with --benchmark"):
        s = mt.Metrics(met).summary
        line = re.search(r"benchmark: transformer amp batch 4 x 1 ranks: ([0-9.e+]+) tokens/s over 2 timed", r.out)
        c.check(abs(s["tokens_per_s_overall"] - context * s["samples_per_s_overall"])
                <= 1e-9 * s["tokens_per_s_overall"], "tokens_per_s_overall = context x samples_per_s_overall",
                f"{s['tokens_per_s_overall']} vs {context} x {s['samples_per_s_overall']}")
        # The mean of the steps' rates, as samples_per_s is (not the throughput, which differs).
        c.check(abs(s["tokens_per_s"] - context * s["samples_per_s"]) <= 1e-9 * s["tokens_per_s"],
                "tokens_per_s = context x samples_per_s", f"{s['tokens_per_s']} vs {context} x {s['samples_per_s']}")
        c.check(bool(line) and abs(float(line.group(1)) - s["tokens_per_s_overall"])
                <= 1e-4 * s["tokens_per_s_overall"], "the Transformer's benchmark line prints its tokens/s",
                line.group(0) if line else r.out[-300:])
    peaks = {}
    for data in (["--data", "fashion-mnist"],
                 ["--data", "synthetic", "--synthetic-size", 64, "--synthetic-features", 784,
                  "--synthetic-classes", 10]):
        met = d / f"peak_{data[1]}.jsonl"
        r = mt.mixtrain(data + ["--hidden", 8, "--batch-size", BATCH, "--benchmark", "--benchmark-warmup", 1,
                                "--steps", 2, "--metrics", met])
        if c.ok_run(r, f"peak_bytes: an MLP on {data[1]}"):
            peaks[data[1]] = mt.Metrics(met).summary["peak_bytes"]
    if len(peaks) == 2:
        c.check(peaks["fashion-mnist"] == peaks["synthetic"] > 0,
                "peak_bytes leaves the data set out (Fashion-MNIST's equals 64 synthetic examples')", f"{peaks}")
    return c.finish()


if __name__ == "__main__":
    sys.exit(main())
