#!/usr/bin/python3
"""The test-set evaluation (launch/evaluation.cc) reports the model's accuracy
and mean loss over the whole test split, whatever the rank count, and runs when
its schedule says (launch/trainer.cc).

  1. An FP32 MLP on a --data-file whose test split has 1003 examples (one
     evaluation batch of 1000 and a partial one of 3 on one rank): the last
     evaluation's eval_accuracy and val_loss, in its metrics line and in the
     summary, are numpy's top-1 accuracy and mean cross-entropy of the saved
     final parameters over all 1003 examples, on 1, 2 and 3 ranks (rank r
     evaluates examples r, r + W, ...; the counts and losses are summed over
     the ranks, the loss divided by the example count), and the log says 1003
     examples. --eval-batches 1 on one rank evaluates the first 1000 only
     (the default --eval-batch-size), and --eval-batches 2 with
     --eval-batch-size 300 the first 600.
  2. The schedule: by default after each epoch's last step and after the
     run's last step; --eval-every 3 after every 3rd step and the last;
     none under --benchmark or --eval false.
  3. The Transformer: a model still at its initialisation (--lr 1e-30 moves
     no weight) predicts a near-uniform next token, so val_loss is ln(vocab)
     nats a token (not per sequence); 1 and 2 ranks give the same evaluation;
     the accuracy counts tokens (a trained model's stays a fraction <= 1).
"""
import math
import re
import sys

import numpy as np

import mixtest as mt

FEATURES, CLASSES, TRAIN, TEST = 8, 4, 64, 1003  # 1003: a batch of 1000 and a partial one of 3
HIDDEN = 12


def write_data(path):
    """A learnable task (labels from a fixed linear map) with a separate test split."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((FEATURES, CLASSES))
    x = rng.standard_normal((TRAIN + TEST, FEATURES)).astype(np.float32)
    y = np.argmax(x @ w + 0.5 * rng.standard_normal((TRAIN + TEST, CLASSES)), axis=1).astype(np.int64)
    mt.safetensors_io.save(path, {"inputs": x[:TRAIN], "labels": y[:TRAIN], "test_inputs": x[TRAIN:],
                                  "test_labels": y[TRAIN:]})
    return x[TRAIN:], y[TRAIN:]


def expected_eval(ckpt, x, y):
    """(correct predictions, mean cross-entropy, near ties) of the checkpoint's MLP on (x, y), in float64.
    A near tie (top two logits within 1e-4) may go either way in FP32: each may add or remove one correct."""
    t, _ = mt.load_checkpoint(ckpt)
    h = np.maximum(x.astype(np.float64) @ t["fc1.weight"].T.astype(np.float64) + t["fc1.bias"], 0)
    logits = h @ t["fc2.weight"].T.astype(np.float64) + t["fc2.bias"]
    top2 = np.sort(logits, axis=1)[:, -2:]
    lse = np.log(np.exp(logits - top2[:, 1:]).sum(axis=1)) + top2[:, 1]
    loss = float(np.mean(lse - logits[np.arange(len(y)), y]))
    correct = int(np.sum(np.argmax(logits, axis=1) == y))
    ties = int(np.sum(top2[:, 1] - top2[:, 0] < 1e-4))
    return correct, loss, ties


def main():
    mt.require_mixtrain()
    c = mt.Checks("evaluation")
    d = mt.workdir("evaluation")
    data = d / "data.safetensors"
    x, y = write_data(data)
    mlp = ["--data-file", data, "--hidden", HIDDEN, "--precision", "fp32", "--batch-size", 16, "--lr", "0.1",
           "--optimizer", "sgd", "--log-every", 100]

    # ---- 1. the last evaluation against numpy, on 1, 2 and 3 ranks ------------------------------
    worlds = (1, 2, 3) if mt.have_mpirun() and mt.os.environ.get("MIX_WITH_MPI") != "OFF" else (1,)
    cases = [(w, [], TEST) for w in worlds] + [(1, ["--eval-batches", 1], 1000),
                                               (1, ["--eval-batches", 2, "--eval-batch-size", 300], 600)]
    for world, extra, examples in cases:
        what = f"{world} rank(s){' ' + ' '.join(map(str, extra)) if extra else ''}"
        ckpt, met = d / f"w{world}_{len(extra)}.st", d / f"w{world}_{len(extra)}.jsonl"
        r = mt.mixtrain([*mlp, "--steps", 3, *extra, "--save", ckpt, "--metrics", met], np=world, timeout=120)
        if not c.ok_run(r, f"MLP, {what}"):
            continue
        m = mt.Metrics(met)
        last = m.evals[-1] if m.evals else {}
        correct, loss, ties = expected_eval(ckpt, x[:examples], y[:examples])
        got = last.get("eval_accuracy", -1) * examples
        c.check(last.get("step") == 3 and abs(got - correct) <= ties + 1e-6,
                f"{what}: eval_accuracy is {correct}/{examples}, numpy's top-1 of the saved parameters",
                f"{last}; numpy {correct} correct, {ties} near ties")
        # FP32 logits and sums against float64: ~1e-7 relative; a wrong weight, shard or count is >= 1e-3.
        c.check(abs(last.get("val_loss", 0) - loss) <= 1e-5 * loss,
                f"{what}: val_loss is numpy's mean cross-entropy over the {examples} examples",
                f"{last.get('val_loss')} vs {loss:.7f}")
        s = m.summary or {}
        c.check(s.get("eval_accuracy") == last.get("eval_accuracy") and s.get("val_loss") == last.get("val_loss"),
                f"{what}: the summary carries the last evaluation", f"{s}")
        c.check(f"({examples} examples)" in r.out, f"{what}: the log counts {examples} test examples",
                "; ".join(re.findall(r"test accuracy.*", r.out))[:300])

    # ---- 2. the schedule --------------------------------------------------------------------------
    # 64 training examples in batches of 16: 4 steps an epoch on one rank.
    for extra, want in ((["--steps", 10], [4, 8, 10]), (["--steps", 7, "--eval-every", 3], [3, 6, 7]),
                        (["--steps", 2, "--eval", "false"], []),
                        (["--steps", 2, "--benchmark", "--benchmark-warmup", 1], [])):
        met = d / "schedule.jsonl"
        r = mt.mixtrain([*mlp, *extra, "--metrics", met])
        if c.ok_run(r, f"schedule, {' '.join(map(str, extra))}"):
            got = [e["step"] for e in mt.Metrics(met).evals]
            c.check(got == want, f"{' '.join(map(str, extra))}: evaluations after steps {want}", f"{got}")

    # ---- 3. the Transformer ---------------------------------------------------------------------------
    vocab, context = 64, 16
    lm = ["--model", "transformer", "--layers", 1, "--d-model", 16, "--heads", 2, "--context", context, "--vocab",
          vocab, "--data", "synthetic", "--precision", "fp32", "--batch-size", 4, "--log-every", 100]
    evals = {}
    for world in worlds[:2]:
        met = d / f"lm_{world}.jsonl"
        r = mt.mixtrain([*lm, "--steps", 1, "--optimizer", "sgd", "--lr", "1e-30", "--metrics", met], np=world,
                        timeout=120)
        if c.ok_run(r, f"Transformer at its initialisation, {world} rank(s)"):
            evals[world] = mt.Metrics(met).evals[-1]
    if 1 in evals:
        # Initial logits are ~N(0, 0.1^2) (weights ~N(0, 0.02), d_model 16): the loss is
        # ln(vocab) + their variance / 2, about 0.005 above; 0.05 allows ten times that.
        c.check(abs(evals[1]["val_loss"] - math.log(vocab)) < 0.05,
                f"an untrained Transformer's val_loss is ln({vocab}) = {math.log(vocab):.4f} nats a token",
                f"{evals[1]['val_loss']}")
    if len(evals) == 2:
        c.check(evals[1]["eval_accuracy"] == evals[2]["eval_accuracy"]
                and abs(evals[1]["val_loss"] - evals[2]["val_loss"]) <= 1e-5 * evals[1]["val_loss"],
                "the Transformer's evaluation on 2 ranks is 1 rank's", f"{evals[1]} vs {evals[2]}")
    met = d / "lm_trained.jsonl"
    r = mt.mixtrain([*lm, "--steps", 40, "--optimizer", "adamw", "--lr", "1e-2", "--eval-every", 40,
                     "--metrics", met])
    if c.ok_run(r, "Transformer, 40 steps"):
        e = mt.Metrics(met).evals[-1]
        # Seven tokens in eight follow from the one before (runtime/data/text.cc), so a model that
        # has learnt some of the rule predicts more than chance, and a fraction of the tokens.
        c.check(2 / vocab < e["eval_accuracy"] <= 1, "a trained Transformer's accuracy is a fraction of its tokens, "
                                                     "above chance", f"{e}")
    c.finish()


if __name__ == "__main__":
    sys.exit(main())
