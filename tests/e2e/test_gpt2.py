#!/usr/bin/python3
"""--model gpt2 end to end through mixtrain (models::transformer_preset(gpt2)):

  1. the preset cut to 2 layers and context 64 (--layers, --context override it; the
     rest is GPT-2 small: d_model 768, 12 heads, vocabulary 50,257 padded to 50,304,
     tied) trains 3 AdamW steps with weight decay on 2 ranks (1 without mpirun) on
     synthetic tokens, evaluates, and saves: the losses are finite and start near
     ln(50,257), the checkpoint has nanoGPT's names, no lm_head, wte [50304, 768] with
     its 47 padding rows still exactly zero;
  2. --init-from a state_dict with the UNPADDED vocabulary (50,257 rows, as PyTorch's
     GPT-2 has it; here the saved checkpoint's rows cut to 50,257, at d_model 64 to
     stay small): it loads into the padded model, the padding zero, and --steps 0
     --save writes back the same parameters;
     A wte of another row count is refused naming both layouts. --d-model and --heads
     override the preset; the context not given stays GPT-2's 1024.
"""
import math
import sys

import numpy as np

import mixtest as mt

SMALL = ["--model", "gpt2", "--layers", 2, "--context", 64, "--data", "synthetic", "--synthetic-size", 32,
         "--log-every", 1]


def main():
    mt.require_mixtrain()
    c = mt.Checks("gpt2")
    d = mt.workdir("gpt2")
    ranks = 2 if mt.have_mpirun() and mt.os.environ.get("MIX_WITH_MPI") != "OFF" else 1

    # ---- 1: the preset trains on 2 ranks -------------------------------------------------------------
    ckpt, met = d / "gpt2.safetensors", d / "gpt2.jsonl"
    r = mt.mixtrain([*SMALL, "--batch-size", 2, "--steps", 3, "--optimizer", "adamw", "--lr", "1e-3",
                     "--weight-decay", "0.1", "--eval", "true", "--eval-every", 3, "--eval-batches", 1,
                     "--save", ckpt, "--metrics", met], np=ranks, timeout=600)
    if c.ok_run(r, f"--model gpt2 --layers 2 --context 64, 3 AdamW steps on {ranks} rank(s)"):
        m = mt.Metrics(met)
        losses = [s["loss"] for s in m.steps]
        c.check(len(losses) == 3 and all(math.isfinite(x) for x in losses), "3 finite losses", f"{losses}")
        # At nanoGPT's initialisation the tied logits are ln_f's unit rows times N(0, 0.02) rows of wte,
        # of std 0.02 sqrt(768) = 0.55: the loss starts near ln(50257) + 0.55^2 / 2 = 10.98. The
        # padding taking probability would add ln(50304 / 50257) = 0.001 only, which the unit tests see.
        c.check(abs(losses[0] - (math.log(50257) + 0.5 * (0.02 ** 2 * 768))) < 0.1,
                "the first loss is near ln(50257) + sigma^2 / 2 = 10.98", f"{losses[0]}")
        ev = m.evals
        c.check(len(ev) == 1 and math.isfinite(ev[0]["val_loss"]) and 0 <= ev[0]["eval_accuracy"] <= 1,
                "an evaluation with a finite validation loss and an accuracy", f"{ev}")
        t, meta = mt.load_checkpoint(ckpt)
        wte = t.get("transformer.wte.weight")
        c.check(wte is not None and wte.shape == (50304, 768), "wte is [50304, 768]",
                f"{None if wte is None else wte.shape}")
        c.check("lm_head.weight" not in t, "tied: no lm_head.weight")
        c.check(t["transformer.wpe.weight"].shape == (64, 768) and t["transformer.h.1.attn.c_attn.weight"].shape
                == (2304, 768) and "transformer.h.2.ln_1.weight" not in t, "2 blocks of GPT-2's width, context 64")
        if wte is not None:
            c.check(not np.any(wte[50257:]), "the 47 padding rows are still exactly zero after AdamW with decay")
            c.check(np.any(wte[:50257]), "the real rows are not")

    # ---- 2: --init-from an unpadded state_dict ------------------------------------------------------
    narrow = ["--model", "gpt2", "--layers", 1, "--d-model", 64, "--heads", 4, "--data", "synthetic",
              "--synthetic-size", 16, "--batch-size", 2]
    first = d / "narrow.safetensors"
    if c.ok_run(mt.mixtrain([*narrow, "--steps", 0, "--save", first]), "a d_model 64 gpt2's initial parameters"):
        params = mt.parameters_only(mt.load_checkpoint(first)[0])
        c.check(params["transformer.wte.weight"].shape == (50304, 64), "--d-model 64 overrides the preset's width")
        c.check(params["transformer.wpe.weight"].shape == (1024, 64), "the preset's context 1024 where not overridden")
        state = dict(params)
        state["transformer.wte.weight"] = params["transformer.wte.weight"][:50257] + 0.5  # PyTorch's 50,257 rows
        unpadded = d / "unpadded_state_dict.safetensors"
        mt.safetensors_io.save(unpadded, state)
        back = d / "back.safetensors"
        if c.ok_run(mt.mixtrain([*narrow, "--init-from", unpadded, "--steps", 0, "--save", back]),
                    "--init-from a state_dict with 50,257 wte rows"):
            loaded = mt.load_checkpoint(back)[0]["transformer.wte.weight"]
            c.check(loaded.shape == (50304, 64) and np.array_equal(loaded[:50257], state["transformer.wte.weight"])
                    and not np.any(loaded[50257:]), "the 50,257 rows load, the padding rows are zero")
        wrong = dict(state)
        wrong["transformer.wte.weight"] = params["transformer.wte.weight"][:50000]
        bad = d / "wrong_rows.safetensors"
        mt.safetensors_io.save(bad, wrong)
        r = mt.mixtrain([*narrow, "--init-from", bad, "--steps", 0, "--save", d / "never.safetensors"])
        c.check(r.rc != 0 and "[50257, 64] without the vocabulary's padding rows" in r.out,
                "a wte of 50,000 rows is refused naming both layouts", f"rc {r.rc}")

    c.finish()


if __name__ == "__main__":
    sys.exit(main())
