#!/usr/bin/python3
"""--data token-shards against --data fortunes, and its memory.

Parity: scripts/make_token_shards.py --split fortunes writes Debian's fortunes
(/usr/share/games/fortunes) as one llm.c shard per split, holding the very byte
streams load_byte_text builds; both data sets cut them into the same windows,
so the Transformer of test_transformer_convergence.py (4 layers, d_model 128,
4 heads, context 128; 2 ranks x 16 sequences, AdamW, warm-up then cosine), run
for STEPS steps on each, must reach the same validation loss within
MAX_DIFF nats/byte (the issue's bar). The data are the same examples in the
same order (the sampler sees the same number of windows), so the runs agree to
the last bit: every logged training loss must be equal, which a window off by
one token, or a batch read from the wrong shard position, would break.

Memory: a sparse llm.c shard of BIG_TOKENS zero tokens (BIG_BYTES on disk,
taking no disk blocks) trains a few steps on one rank; the peak resident set
size (ru_maxrss of the process) must stay under that of the same run on the
small fortunes shards plus MAX_RSS_GROWTH, well below the file's size. The
file is mapped and scanned once for tokens beyond --vocab; a reader that read
the file into memory, or one that kept the scanned pages mapped, would hold
the whole file and fail.
"""
import os
import shutil
import sys

import mixtest as mt

FORTUNES = "/usr/share/games/fortunes"
STEPS = 40
EVAL_BATCHES = 4
MAX_DIFF = 0.02
BIG_TOKENS = 1 << 28  # uint16: 512 MiB
BIG_BYTES = 1024 + 2 * BIG_TOKENS
MAX_RSS_GROWTH = 128 << 20

MODEL = ["--model", "transformer", "--layers", 4, "--d-model", 128, "--heads", 4, "--context", 128]


def train_flags(metrics):
    return MODEL + ["--precision", "fp32", "--steps", STEPS, "--batch-size", 16, "--optimizer", "adamw", "--lr", "2e-3",
                    "--weight-decay", "0.1", "--lr-schedule", "cosine", "--warmup-steps", 5, "--eval-every", STEPS,
                    "--eval-batches", EVAL_BATCHES, "--log-every", 10, "--metrics", metrics]


def peak_rss(args, timeout=300):
    """(exit status, output, peak resident bytes) of one mixtrain process on one rank: measured in a
    fresh Python, whose only child is mixtrain, so RUSAGE_CHILDREN is that process's alone."""
    probe = ("import resource, subprocess, sys\n"
             "r = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)\n"
             "sys.stdout.write(r.stdout)\n"
             "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "sys.exit(r.returncode)\n")
    r = mt.launch([sys.executable, "-c", probe, mt.MIXTRAIN, *args], timeout=timeout)
    kb = [int(line.split()[1]) for line in r.out.splitlines() if line.startswith("PEAK_RSS_KB")]
    return r, (kb[0] * 1024 if kb else None)


def main():
    mt.require_mixtrain()
    if not os.path.isdir(FORTUNES):
        mt.skip(f"no {FORTUNES} (apt-get install fortunes, or scripts/setup.sh)")
    c = mt.Checks("token_shards")
    d = mt.workdir("token_shards")
    shards = d / "fortunes_shards"
    r = mt.launch([sys.executable, mt.SOURCE_DIR / "scripts" / "make_token_shards.py", "--split", "fortunes", shards,
                   FORTUNES], timeout=120)
    if not c.ok_run(r, "make_token_shards.py --split fortunes"):
        c.finish()
    names = sorted(p.name for p in shards.iterdir())
    c.check(names == ["bytes_train_000000.bin", "bytes_val_000000.bin"], "one llm.c shard per split", " ".join(names))

    # ---- parity with --data fortunes ------------------------------------------------
    have_mpi = os.environ.get("MIX_WITH_MPI") != "OFF" and mt.have_mpirun()
    np_ = 2 if have_mpi else 1
    val, losses = {}, {}
    for name, data in (("fortunes", ["--data", "fortunes"]),
                       ("token-shards", ["--data", "token-shards", "--data-dir", shards])):
        met = d / f"{name}.jsonl"
        r = mt.mixtrain(data + train_flags(met), np=np_, timeout=300)
        if not c.ok_run(r, f"transformer on --data {name}, {np_} rank(s), {STEPS} steps"):
            continue
        m = mt.Metrics(met)
        val[name] = m.summary["val_loss"]
        losses[name] = [s["loss"] for s in m.steps]
        print(f"{name}: validation loss {val[name]:.6f} nats/byte after {STEPS} steps ({r.seconds:.1f} s)")
    if len(val) == 2:
        diff = val["token-shards"] - val["fortunes"]
        c.check(abs(diff) <= MAX_DIFF, f"validation loss within {MAX_DIFF} of --data fortunes",
                f"token-shards {val['token-shards']:.6f}, fortunes {val['fortunes']:.6f} ({diff:+.2e})")
        c.check(val["fortunes"] < 4.0, "the runs learnt something (below 4 nats/byte; ln 256 = 5.55)",
                f"{val['fortunes']:.4f}")
        a, b = losses["fortunes"], losses["token-shards"]
        worst = max((abs(x - y) for x, y in zip(a, b)), default=float("nan"))
        c.check(len(a) == len(b) and len(a) > 0 and worst == 0, "the same training loss at every logged step",
                f"{len(a)} and {len(b)} steps, largest difference {worst:.3e}")

    # ---- memory: a shard much larger than the process must not become resident ------
    big = d / "big"
    big.mkdir()
    shutil.copy(shards / "bytes_val_000000.bin", big / "bytes_val_000000.bin")
    header = bytearray(1024)
    header[0:12] = (20240520).to_bytes(4, "little") + (1).to_bytes(4, "little") + BIG_TOKENS.to_bytes(4, "little")
    with open(big / "big_train_000000.bin", "wb") as f:
        f.write(header)
        f.truncate(BIG_BYTES)  # a hole: zero tokens that take no disk blocks
    few = MODEL + ["--steps", 3, "--batch-size", 16, "--eval", "false", "--precision", "fp32"]
    small_r, small_rss = peak_rss(few + ["--data", "token-shards", "--data-dir", shards])
    big_r, big_rss = peak_rss(few + ["--data", "token-shards", "--data-dir", big])
    ok = c.ok_run(small_r, "3 steps on the fortunes shards") & c.ok_run(big_r, "3 steps on a 512 MiB shard")
    if ok and small_rss and big_rss:
        mib = 1 << 20
        c.check(big_rss < small_rss + MAX_RSS_GROWTH,
                f"peak RSS with a {BIG_BYTES // mib} MiB shard within {MAX_RSS_GROWTH // mib} MiB of the small one's",
                f"{big_rss / mib:.0f} MiB vs {small_rss / mib:.0f} MiB")
    c.finish()


if __name__ == "__main__":
    sys.exit(main())
