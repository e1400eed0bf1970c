#!/usr/bin/python3
"""--cuda-graph trains exactly as op-by-op steps do.

One AMP resnet-small run with --cuda-graph and two without, each of 2 epochs
of 72 examples in batches of 16 (every epoch ends with a partial batch of 8,
which a recording of batch 16 cannot run), an evaluation after every 3
steps (a forward pass between replays, allocating from the shared cache) and
an overflow injected at step 4 (a replay must skip that step, and only that):
  1. the runs succeed, and the two op-by-op runs give the same losses (the
     kernels add in fixed orders, so a difference below is the flag's);
  2. every step's loss, loss scale and gradient bytes, and every evaluation, are the same in
     both runs (on a GPU: the recorded kernels replayed on the recorded memory
     give the op-by-op bits; an evaluation or a partial batch between replays
     must not disturb them);
  2b. a fourth run, --cuda-graph with the one rank's all-reduces kept
     (--no-elide-single-rank-sync; one rank has none by default), gives the
     same losses, and every step reports the same gradient bytes, above 0
     (a replay calls no communicator: the trainer reports those counted while
     recording);
  3. on the CPU, --cuda-graph says why it does nothing (nothing to record);
     on a GPU (MIX_E2E_DEVICE=cuda, as scripts/gpu_check.sh runs it) the log
     says which step was recorded.
"""
import os

import mixtest as mt

DEVICE = os.environ.get("MIX_E2E_DEVICE", "cpu")


def main():
    c = mt.Checks("cuda_graph_flag")
    d = mt.workdir("cuda_graph_flag")
    common = ["--device", DEVICE, "--model", "resnet-small", "--width", 4, "--blocks", "1,1", "--image-size", 16,
              "--data", "synthetic", "--synthetic-size", 72, "--batch-size", 16, "--epochs", 2, "--eval-every", 3,
              "--precision", "amp", "--log-every", 1, "--inject-overflow", 4]
    runs = {}
    for name, extra in (("op by op", []), ("op by op again", []), ("--cuda-graph", ["--cuda-graph"]),
                        ("--cuda-graph, all-reduces kept", ["--cuda-graph", "--no-elide-single-rank-sync"])):
        met = d / f"{name.strip('-').replace(' ', '_')}.jsonl"
        r = mt.mixtrain(common + extra + ["--metrics", met])
        if not c.ok_run(r, name):
            return c.finish()
        runs[name] = (r, mt.Metrics(met))
    (_, eager), (_, again), (graph_run, graph) = runs["op by op"], runs["op by op again"], runs["--cuda-graph"]
    kept = runs["--cuda-graph, all-reduces kept"][1]

    # The comparison below means something only if op-by-op runs repeat themselves exactly.
    c.check([s["loss"] for s in eager.steps] == [s["loss"] for s in again.steps],
            "two op-by-op runs give the same losses (else a kernel is nondeterministic and the comparison says nothing)")

    c.check(len(eager.steps) == 10 and len(graph.steps) == 10, "both runs have 2 epochs of 5 steps",
            f"{len(eager.steps)} and {len(graph.steps)} step lines")
    # grad_bytes: a replay calls no communicator; the trainer reports the bytes counted while recording.
    for key in ("loss", "loss_scale", "found_inf", "grad_bytes"):
        a = [s.get(key) for s in eager.steps]
        b = [s.get(key) for s in graph.steps]
        c.check(a == b, f"every step's {key} is the op-by-op run's", f"{a} vs {b}" if a != b else "")
    for key in ("loss", "loss_scale", "found_inf"):
        a = [s.get(key) for s in eager.steps]
        b = [s.get(key) for s in kept.steps]
        c.check(a == b, f"with the all-reduces kept, every step's {key} is the op-by-op run's",
                f"{a} vs {b}" if a != b else "")
    kept_bytes = {s.get("grad_bytes") for s in kept.steps}
    c.check(len(kept_bytes) == 1 and min(kept_bytes) > 0, "with the all-reduces kept, every step reports the same "
            "gradient bytes, above 0 (replays: those counted while recording)", f"{sorted(kept_bytes)}")
    strip = lambda evals: [{k: v for k, v in e.items() if not k.endswith("_s") and k != "seconds"} for e in evals]
    skipped = [s["step"] for s in graph.steps if s["found_inf"]]
    c.check(skipped == [4], "the --cuda-graph run skips step 4 only, where the overflow was injected", f"{skipped}")
    same_evals = len(eager.evals) > 1 and strip(eager.evals) == strip(graph.evals)
    c.check(same_evals, "every evaluation is the op-by-op run's",
            "" if same_evals else f"{strip(eager.evals)} vs {strip(graph.evals)}")

    if DEVICE == "cpu":
        said = "--cuda-graph: the CPU runs each op as it is called" in graph_run.out
        c.check(said, "on the CPU, --cuda-graph says why it records nothing", "" if said else graph_run.out[-300:])
    else:
        said = "step 2 recorded as a CUDA graph" in graph_run.out
        c.check(said, "on a GPU, the second step is recorded", "" if said else graph_run.out[-300:])
    return c.finish()


if __name__ == "__main__":
    main()
