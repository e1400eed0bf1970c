#!/usr/bin/python3
"""The Transformer language model (models/transformer.cc) end to end through mixtrain:

  1. data parallel, FP32: 2 ranks x batch 4 give the parameters of 1 rank x batch 8
     after 6 SGD steps (the same examples, see test_dp_equivalence.py for why;
     --shuffle false, no dropout), within 1e-5 relative: the FP32 sums differ only
     in order; a wrong shard or a missing division is off by >= 1e-2. SGD, not
     AdamW: AdamW's first steps move every weight by about lr * sign(g), so a
     gradient within rounding of zero can move its weight either way by lr,
     which no tolerance on summation order bounds;
  2. AMP, 2 ranks, dropout 0.1 (each rank draws its own masks), --check-every 1:
     every rank's FP32 masters agree after every step; two identical runs write
     byte-identical checkpoints (dropout masks are reproducible); the metrics carry
     tokens_per_s, and --eval-every gives val_loss lines;
  3. --inject-overflow 4:1: every rank skips step 4 and only step 4;
  4. --steps 0 --save writes nanoGPT's state_dict names, and --tie-weights drops
     lm_head.weight;
  5. the precision lists: by default attention is one fused_attention op (white list:
     FP16 in and out, FP32 statistics) and no [T, T] tensor is declared; with
     --no-fused-attention the causal softmax is FP32 (black list) between FP16
     matmuls, and --amp-white-list softmax runs it in FP16 with no casts around it;
     the loss stores no softmax by default (RowStats; runtime/passes/recompute_softmax.h)
     and does with --store-softmax, and the two write the same checkpoint;
  6. a --data-dir of the user's own text trains and evaluates; bad input: a
     --data-dir without text, --heads that do not divide --d-model, a --vocab
     too small for bytes.
"""
import re
import sys

import numpy as np

import mixtest as mt

TINY = ["--model", "transformer", "--layers", 2, "--d-model", 32, "--heads", 4, "--context", 32,
        "--optimizer", "adamw", "--lr", "3e-3", "--eval", "false", "--log-every", 5]


def main():
    mt.require_mixtrain()
    c = mt.Checks("transformer_multirank")
    d = mt.workdir("transformer_multirank")
    multirank = mt.have_mpirun() and mt.os.environ.get("MIX_WITH_MPI") != "OFF"

    if multirank:
        # ---- 1: data-parallel equivalence in FP32 -----------------------------------------------------
        base = [*TINY, "--precision", "fp32", "--data", "synthetic", "--synthetic-size", 256, "--shuffle", "false",
                "--steps", 6, "--seed", 5, "--optimizer", "sgd", "--lr", "0.5"]
        init = d / "dp_init.safetensors"
        c.ok_run(mt.mixtrain([*base, "--steps", 0, "--save", init]), "initial parameters")
        runs = {}
        for world in (1, 2):
            ckpt = d / f"dp_{world}.safetensors"
            r = mt.mixtrain([*base, "--batch-size", 8 // world, "--save", ckpt], np=world, timeout=300)
            if c.ok_run(r, f"FP32, {world} rank(s) x batch {8 // world}"):
                runs[world] = mt.load_checkpoint(ckpt)[0]
        if len(runs) == 2 and init.exists():
            params = mt.parameters_only(runs[1])
            start = mt.load_checkpoint(init)[0]
            moved = max(mt.rel_diff(start[k], runs[1][k]) for k in params)
            c.check(moved > 1e-3, "training moved the parameters far beyond the tolerance", f"{moved:.2e}")
            worst = max(mt.rel_diff(runs[1][k], runs[2][k]) for k in params)
            c.check(worst <= 1e-5, "2 ranks x 4 = 1 rank x 8 after 6 SGD steps (max relative difference <= 1e-5)",
                    f"{worst:.2e}")

        # ---- 2: AMP with dropout: ranks agree every step; runs are reproducible -----------------------
        ckpts = []
        for rep in (1, 2):
            ckpt, met = d / f"amp_{rep}.safetensors", d / f"amp_{rep}.jsonl"
            r = mt.mixtrain([*TINY, "--data", "fortunes", "--dropout", "0.1", "--batch-size", 4, "--steps", 8,
                             "--check-every", 1, "--eval", "true", "--eval-every", 4, "--eval-batches", 2,
                             "--save", ckpt, "--metrics", met], np=2, timeout=300)
            if c.ok_run(r, f"2 ranks, AMP, fortunes, dropout 0.1, --check-every 1, run {rep}"):
                ckpts.append(ckpt)
                if rep == 1:
                    m = mt.Metrics(met)
                    c.check(all(s.get("tokens_per_s", 0) > 0 for s in m.steps),
                            "every step's metrics carry tokens_per_s")
                    evals = m.evals
                    c.check([e["step"] for e in evals] == [4, 8], "--eval-every 4 evaluates at steps 4 and 8",
                            f"{[e['step'] for e in evals]}")
                    c.check(all(0 < e["val_loss"] < 6.0 for e in evals), "val_loss is a finite loss below ln(256)",
                            f"{[e['val_loss'] for e in evals]}")
        if len(ckpts) == 2:
            c.check(ckpts[0].read_bytes() == ckpts[1].read_bytes(),
                    "two identical runs with dropout: byte-identical checkpoints")

        # ---- 3: an injected overflow on rank 1 is skipped by every rank -------------------------------
        met = d / "overflow.jsonl"
        r = mt.mixtrain([*TINY, "--data", "synthetic", "--batch-size", 4, "--steps", 6, "--check-every", 1,
                         "--inject-overflow", "4:1", "--metrics", met], np=2, timeout=300)
        if c.ok_run(r, "2 ranks, --inject-overflow 4:1, --check-every 1"):
            skipped = [s["step"] for s in mt.Metrics(met).steps if s["skipped"]]
            c.check(skipped == [4], "only step 4 is skipped, on every rank", f"{skipped}")
    else:
        print("NOTE: no mpirun in this build: the multi-rank parts are not run")

    # ---- 4: nanoGPT's names --------------------------------------------------------------------------
    for tie in (False, True):
        out = d / f"names_{int(tie)}.safetensors"
        r = mt.mixtrain([*TINY, "--data", "synthetic", "--steps", 0, "--save", out, *(["--tie-weights"] if tie else [])])
        if c.ok_run(r, f"--steps 0 --save, tie-weights {tie}"):
            t, _ = mt.load_checkpoint(out)
            names = set(mt.parameters_only(t))
            want = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                    "transformer.h.1.attn.c_attn.weight", "transformer.h.1.mlp.c_proj.bias",
                    "transformer.h.0.ln_2.bias"}
            c.check(want <= names, "nanoGPT parameter names", f"missing {sorted(want - names)}")
            c.check(("lm_head.weight" in names) != tie, f"lm_head.weight present iff untied (tie {tie})")
            c.check(t["transformer.h.0.attn.c_attn.weight"].shape == (96, 32), "c_attn.weight is [3d, d]",
                    f"{t['transformer.h.0.attn.c_attn.weight'].shape}")
            c.check(len(names) == 2 * 12 + 4 + (0 if tie else 1), "2 blocks of 12 tensors, wte, wpe, ln_f, lm_head",
                    f"{len(names)}")
            c.check(abs(float(np.std(t["transformer.wte.weight"])) - 0.02) < 0.002, "wte ~ N(0, 0.02)",
                    f"std {np.std(t['transformer.wte.weight']):.4f}")

    # ---- 5: where the attention softmax runs ---------------------------------------------------------
    r = mt.mixtrain([*TINY, "--data", "synthetic", "--print-program"])
    lines = [l for l in r.stdout.splitlines() if re.search(r"= fused_attention\(", l)]
    # Packed QKV in, tokens first out ([B, T, heads, head_dim], layout bthd: no split or transposes), LSE [B, heads, T].
    c.check(r.rc == 0 and len(lines) == 2 and all(".context:f16[?, 32, 4, 8]" in l and ".lse:f32[?, 4, 32]" in l
                                                  and "(QKV=" in l and "causal=true" in l and 'layout="bthd"' in l
                                                  for l in lines),
            "by default: one fused_attention a layer, packed QKV, tokens first, FP16 output, FP32 LSE",
            "; ".join(lines)[:400])
    c.check(r.rc == 0 and not re.search(r"\[\?, 4, 32, 32\]", r.stdout) and " softmax(" not in r.stdout,
            "by default: no [T, T] scores or probabilities, no attention softmax", "")
    for extra, dtype, want_input, what in (
            ([], "f32", "scores)", "default lists: the causal softmax runs in FP32, reading the FP16 scores "
                                   "(out_dtype f32, no cast)"),
            (["--no-fold-casts"], "f32", "scores.cast_fp32)", "--no-fold-casts: FP32 on a cast of the FP16 scores"),
            (["--amp-white-list", "softmax"], "f16", "scores)", "--amp-white-list softmax: FP16, no cast")):
        r = mt.mixtrain([*TINY, "--data", "synthetic", "--print-program", "--no-fused-attention", *extra])
        lines = [l for l in r.stdout.splitlines() if re.search(r"= softmax\(", l)]
        folded = not extra
        c.check(r.rc == 0 and len(lines) == 2 and all(f".att:{dtype}[" in l and want_input in l and "causal=true" in l
                                                      and ('out_dtype="f32"' in l) == folded for l in lines),
                what, "; ".join(lines)[:400])

    # The loss: RowStats by default, Softmax with --store-softmax; the same bits after 4 AMP steps.
    ckpts = []
    # The printed outputs: "logits.softmax.row_stats:f32[?, 32, 2]" or "logits.softmax:f32[?, 32, 256]".
    for extra, output, what in (([], ".row_stats:f32[?, 32, 2]", "RowStats"),
                                (["--store-softmax"], "softmax:f32[?, 32, 256]", "Softmax")):
        r = mt.mixtrain([*TINY, "--data", "synthetic", "--print-program", *extra])
        lines = [l for l in r.stdout.splitlines() if re.search(r"= softmax_with_cross_entropy\(", l)]
        c.check(r.rc == 0 and len(lines) == 1 and output in lines[0].split(" = ")[0],
                f"{' '.join(extra) or 'by default'}: the loss writes {what}", "; ".join(lines)[:400])
        ckpt = d / f"loss_{len(extra)}.safetensors"
        r = mt.mixtrain([*TINY, "--data", "synthetic", "--batch-size", 4, "--steps", 4, "--save", ckpt, *extra])
        if c.ok_run(r, f"4 AMP steps {' '.join(extra) or 'recomputing the softmax'}"):
            ckpts.append(ckpt)
    if len(ckpts) == 2:
        c.check(ckpts[0].read_bytes() == ckpts[1].read_bytes(),
                "softmax recomputed or stored: byte-identical checkpoints after 4 steps")

    # ---- 6: bad input ----------------------------------------------------------------------------------
    empty = d / "no_text"
    empty.mkdir(exist_ok=True)
    r = mt.mixtrain([*TINY, "--data", "fortunes", "--data-dir", empty, "--steps", 1])
    c.check(r.rc != 0 and "apt-get install fortunes" in r.stderr + r.stdout,
            "a text directory without files: an error that says what to install", r.describe(600))
    r = mt.mixtrain([*TINY, "--heads", 3, "--steps", 1])
    c.check(r.rc == 2 and "--heads" in r.stderr, "--heads 3 with --d-model 32: exit 2 naming --heads", r.describe(600))
    r = mt.mixtrain([*TINY, "--data", "fortunes", "--vocab", 100, "--steps", 1])
    c.check(r.rc == 2 and "--vocab 100" in r.stderr and "256" in r.stderr,
            "--vocab 100 on byte text: exit 2 naming --vocab and 256", r.describe(600))
    own = d / "own_text"
    own.mkdir(exist_ok=True)
    (own / "notes.txt").write_text("".join(f"note {k}: the quick brown fox jumps over the lazy dog\n%\n"
                                           for k in range(200)))
    met = d / "own_text.jsonl"
    r = mt.mixtrain([*TINY, "--data", "fortunes", "--data-dir", own, "--batch-size", 4, "--steps", 3,
                     "--eval", "true", "--eval-every", 3, "--metrics", met])
    if c.ok_run(r, "--data-dir with the user's own text: 3 steps and an evaluation"):
        ev = mt.Metrics(met).evals
        c.check(len(ev) == 1 and 0 < ev[0]["val_loss"] < 10, "one evaluation with a finite validation loss",
                f"{ev}")
    c.finish()


if __name__ == "__main__":
    sys.exit(main())
