#!/usr/bin/python3
"""--precision bf16: the AMP lists in BF16, FP32 masters, no loss scaling by default.

Checks:
  1. --print-program: every white op (mul) reads BF16 casts and nothing is
     FP16; the loss stays FP32; the scaler is "none", initial scale 1;
  2. one SGD step of the MLP matches PyTorch's torch.autocast("cpu",
     dtype=torch.bfloat16) step from the same weights and batch: every
     parameter's update within 5% of the tensor's largest update. Why 5%:
     BF16 keeps 8 bits (a rounding moves a value by up to 2^-9, 0.2%); an
     update passes through about six roundings on either side (input and
     weight casts, the GEMM's output, the bias add, relu, the gradient GEMMs),
     taken at other places by torch (its addmm adds the bias before rounding),
     so the sides differ by a few tenths of a percent, and 5% leaves room for
     where those add up. The step is BF16's, not FP32's: it differs from an
     FP32 step by more than 1e-4 of the largest update, which FP32 noise (1e-7)
     never reaches;
  3. the MLP in BF16 trains Fashion-MNIST to >= 84% test accuracy in 2 epochs
     on 2 ranks (the FP16 bar of e2e.test_convergence);
  4. --grad-reduce bf16 sends 2 bytes a parameter (half of fp32's 4, the
     default's): the BF16 gradients travel, cast to FP32 after;
  5. found_inf is still checked: --inject-overflow 2:1 skips step 2 on both
     ranks, at scale 1;
  6. --loss-scaling dynamic is allowed (scale 32768); --grad-reduce fp16 with
     bf16, and bf16 with amp, are refused with exit 2.
"""
import json
import os
import sys
from pathlib import Path

import mixtest as mt

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"FAIL: {sys.executable} cannot import numpy/torch ({e}): run scripts/setup.sh, use /usr/bin/python3")
    sys.exit(1)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from mlp_reference import Mlp  # noqa: E402

N, FEATURES, HIDDEN, CLASSES, LR = 64, 40, (32, 16), 6, 0.5


def torch_step(init, x, y, autocast):
    model = Mlp((FEATURES, *HIDDEN, CLASSES))
    model.load_state_dict({k: torch.from_numpy(v) for k, v in init.items()})
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    if autocast:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    else:
        loss = F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    opt.step()
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def main():
    c = mt.Checks("bf16")
    d = mt.workdir("bf16")
    small = [*mt.synthetic(size=256, features=32, classes=5, hidden=(16,)), "--batch-size", 16, "--eval", "false"]

    # 1. The program.
    r = mt.mixtrain([*small, "--precision", "bf16", "--print-program"], timeout=60)
    ops = mt.program_ops(r.out)
    # The MLP's linear layers: mul, run with its bias add as one fused_matmul_bias.
    muls = [op for op in ops.values() if op.type in ("mul", "fused_matmul_bias")]
    c.check(r.rc == 0 and muls and all(".cast_bf16" in op.ins_text for op in muls),
            "every linear layer reads BF16 casts", r.describe(300) if r.rc else "")
    c.check(":f16[" not in r.out and ":bf16[" in r.out, "BF16 values, no FP16 one")
    c.check("none scaler, initial scale 1" in r.out, "no loss scaling by default")

    # 2. One step against torch.autocast.
    torch.manual_seed(3)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((N, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=N).astype(np.int64)
    y[0] = CLASSES - 1
    init = {k: v.detach().numpy().copy() for k, v in Mlp((FEATURES, *HIDDEN, CLASSES)).state_dict().items()}
    data, init_file, out = d / "data.safetensors", d / "init.safetensors", d / "step.safetensors"
    mt.safetensors_io.save(str(data), {"inputs": x, "labels": y})
    mt.safetensors_io.save(str(init_file), init)
    r = mt.mixtrain(["--precision", "bf16", "--data-file", data, "--init-from", init_file, "--shuffle", "false",
                     "--steps", 1, "--batch-size", N, "--hidden", ",".join(map(str, HIDDEN)), "--optimizer", "sgd",
                     "--lr", LR, "--eval", "false", "--save", out], timeout=60)
    if c.ok_run(r, "one BF16 step"):
        ours = mt.load_checkpoint(out)[0]
        bf16 = torch_step(init, x, y, autocast=True)
        fp32 = torch_step(init, x, y, autocast=False)
        for k in init:
            upd_ours, upd_torch, upd_fp32 = ours[k] - init[k], bf16[k] - init[k], fp32[k] - init[k]
            scale = float(np.abs(upd_torch).max())
            diff = float(np.abs(upd_ours - upd_torch).max())
            c.check(diff <= 0.05 * scale, f"{k}: the update is torch.autocast(bfloat16)'s to 5% of its largest",
                    f"{diff / scale:.2%}")
        worst = max(float(np.abs((ours[k] - init[k]) - (fp32[k] - init[k])).max()) /
                    float(np.abs(fp32[k] - init[k]).max()) for k in init)
        c.check(worst > 1e-4, "and differs from FP32's by more than FP32 noise", f"{worst:.2%}")

    # 3. Convergence on Fashion-MNIST.
    if os.path.isdir("/usr/share/datasets/fashion-mnist"):
        r = mt.mixtrain(["--model", "mlp", "--precision", "bf16", "--epochs", 2, "--batch-size", 64, "--lr", 0.05,
                         "--lr-schedule", "cosine", "--metrics", d / "fm.jsonl"], np=2, timeout=300)
        if c.ok_run(r, "2 epochs of Fashion-MNIST"):
            acc = mt.Metrics(d / "fm.jsonl").summary["eval_accuracy"]
            c.check(acc >= 0.84, "BF16 MLP: test accuracy >= 84%", f"{100 * acc:.2f}%")

    # 4. The bytes of a BF16 all-reduce.
    init_small = d / "init_small.safetensors"
    r = mt.mixtrain([*small, "--steps", 0, "--save", init_small], timeout=60)
    n = sum(v.size for k, v in mt.load_checkpoint(init_small)[0].items() if not k.startswith("optimizer."))
    sent = {}
    for reduce in ("bf16", "fp32"):
        m = d / f"reduce_{reduce}.jsonl"
        r = mt.mixtrain([*small, "--precision", "bf16", "--grad-reduce", reduce, "--steps", 2, "--metrics", m], np=2)
        if c.ok_run(r, f"--grad-reduce {reduce}"):
            sent[reduce] = {s["grad_bytes"] for s in mt.Metrics(m).steps}
    c.check(sent.get("bf16") == {2 * n} and sent.get("fp32") == {4 * n},
            "--grad-reduce bf16 sends 2 bytes a parameter, fp32 4", f"{sent}, {n} parameters")

    # 5. Overflow checks still run.
    m = d / "inject.jsonl"
    r = mt.mixtrain([*small, "--precision", "bf16", "--steps", 3, "--inject-overflow", "2:1", "--metrics", m], np=2)
    if c.ok_run(r, "--inject-overflow 2:1 under bf16"):
        steps = mt.Metrics(m).steps
        c.check([s["skipped"] for s in steps] == [False, True, False] and all(s["loss_scale"] == 1 for s in steps),
                "step 2 skipped on every rank, at scale 1")

    # 6. The scaler on request; the refusals.
    m = d / "dynamic.jsonl"
    r = mt.mixtrain([*small, "--precision", "bf16", "--loss-scaling", "dynamic", "--steps", 2, "--metrics", m])
    if c.ok_run(r, "--loss-scaling dynamic under bf16"):
        c.check(mt.Metrics(m).step(1)["loss_scale"] == 32768, "the dynamic scaler, at 32768")
    for flags, names in ((["--precision", "bf16", "--grad-reduce", "fp16"], "--grad-reduce fp16 needs --precision amp"),
                         (["--precision", "amp", "--grad-reduce", "bf16"], "--grad-reduce bf16 needs --precision bf16")):
        r = mt.mixtrain([*small, *flags, "--steps", 1], timeout=30)
        c.check(r.rc == 2 and names in r.out, f"{' '.join(flags)}: exit 2", r.describe(300))
    c.finish()


if __name__ == "__main__":
    main()
