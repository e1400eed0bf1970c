#!/usr/bin/python3
"""Reference values of one MLP training step, computed by PyTorch, for tests/unit/test_mlp_parity.cc.

    /usr/bin/python3 tests/python/mlp_reference.py OUT.safetensors [--seed 0] [--sizes 784,64,32,10] [--batch 16]

Builds an nn.Linear MLP (fc1 -> relu -> fc2 -> relu -> ... -> fcL, the layout of
mixtrain's models/mlp.cc, so the state_dict names are the same), in float32 with
PyTorch's default initialisation, a batch x ~ N(0, 1) [B, in] with random labels,
and writes to OUT (safetensors, via tests/python/safetensors_io.py):

    init.<name>                initial parameters (state_dict names: fc1.weight [out, in], fc1.bias [out], ...)
    x                          f32 [B, in]
    label                      i64 [B, 1]  (the shape of mixtrain's `label` feed)
    loss                       f32 [1]     mean softmax cross-entropy at the initial parameters
    grad.<name>                d loss / d param at the initial parameters
    loss64, grad64.<name>      the same computed in float64 from the same float32 values, rounded to
                               float32 (mixtrain reads no F64): the exact answer to within 6e-8
                               relative, to tell which FP32 implementation drifted when a check fails
    <opt>.<name>               parameters after 1 step of <opt> from init on (x, label)
    <opt>3.<name>              parameters after 3 more steps on the same batch (4 steps in all),
                               so that optimizer state (velocity, moments, step count) must carry over
    <opt>.loss                 f32 [4]: the loss at each of those 4 steps (before its update)

for <opt> in sgd (lr 0.1), momentum (torch.optim.SGD, lr 0.1, momentum 0.9) and adamw
(torch.optim.AdamW, lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01). The
hyperparameters are also in the header metadata (`sgd.lr`, `momentum.momentum`, ...) so
that the C++ test builds its optimizers from the file rather than from a second copy.

Deterministic: seeded, torch.set_num_threads(2), torch.use_deterministic_algorithms(True).
Exit status 0 on success, 1 (with the reason on stderr) on bad arguments.
"""
import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import safetensors_io  # noqa: E402

OPTIMIZERS = {
    # name: (constructor, hyperparameters written to the metadata)
    "sgd": (lambda ps, h: torch.optim.SGD(ps, lr=h["lr"]), {"lr": 0.1}),
    "momentum": (lambda ps, h: torch.optim.SGD(ps, lr=h["lr"], momentum=h["momentum"]), {"lr": 0.1, "momentum": 0.9}),
    "adamw": (
        lambda ps, h: torch.optim.AdamW(
            ps, lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"], weight_decay=h["weight_decay"]
        ),
        {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01},
    ),
}
EXTRA_STEPS = 3


class Mlp(nn.Module):
    """fc1 -> relu -> fc2 -> relu -> ... -> fcL; attribute names give the state_dict names."""

    def __init__(self, sizes):
        super().__init__()
        self.n = len(sizes) - 1
        for i in range(self.n):
            setattr(self, f"fc{i + 1}", nn.Linear(sizes[i], sizes[i + 1]))

    def forward(self, x):
        for i in range(self.n):
            x = getattr(self, f"fc{i + 1}")(x)
            if i + 1 < self.n:
                x = torch.relu(x)
        return x


def parse_sizes(text):
    sizes = [int(s) for s in text.split(",") if s.strip()]
    if len(sizes) < 2 or any(s <= 0 for s in sizes) or sizes[-1] < 2:
        raise argparse.ArgumentTypeError(f"--sizes {text!r}: need IN,[HIDDEN,...],CLASSES with positive sizes, CLASSES >= 2")
    return sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="safetensors file to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("784,64,32,10"), help="IN,HIDDEN...,CLASSES")
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args()
    if a.batch <= 0:
        ap.error("--batch must be positive")

    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(a.seed)
    sizes = a.sizes

    model = Mlp(sizes).float()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x = torch.randn(a.batch, sizes[0], dtype=torch.float32)
    label = torch.randint(0, sizes[-1], (a.batch,), dtype=torch.int64)

    out = {f"init.{k}": v.numpy() for k, v in init.items()}
    out["x"] = x.numpy()
    out["label"] = label.reshape(a.batch, 1).numpy()

    # Loss and gradients at the initial parameters (float32, then float64).
    loss = F.cross_entropy(model(x), label)
    loss.backward()
    out["loss"] = np.array([loss.item()], np.float32)
    for k, p in model.named_parameters():
        out[f"grad.{k}"] = p.grad.detach().numpy().copy()

    m64 = Mlp(sizes).double()
    m64.load_state_dict({k: v.double() for k, v in init.items()})
    loss64 = F.cross_entropy(m64(x.double()), label)
    loss64.backward()
    out["loss64"] = np.array([loss64.item()], np.float32)
    for k, p in m64.named_parameters():
        out[f"grad64.{k}"] = p.grad.detach().numpy().astype(np.float32)

    # Optimizer steps from the same initial parameters.
    for name, (make, hp) in OPTIMIZERS.items():
        model.load_state_dict(init)
        opt = make(model.parameters(), hp)
        losses = []
        for step in range(1 + EXTRA_STEPS):
            opt.zero_grad(set_to_none=True)
            step_loss = F.cross_entropy(model(x), label)
            step_loss.backward()
            losses.append(step_loss.item())
            opt.step()
            if step == 0 or step == EXTRA_STEPS:
                prefix = name if step == 0 else f"{name}{EXTRA_STEPS}"
                for k, v in model.state_dict().items():
                    out[f"{prefix}.{k}"] = v.detach().numpy().copy()
        out[f"{name}.loss"] = np.array(losses, np.float32)

    meta = {"seed": str(a.seed), "sizes": ",".join(map(str, sizes)), "batch": str(a.batch),
            "extra_steps": str(EXTRA_STEPS), "torch": torch.__version__}
    for name, (_, hp) in OPTIMIZERS.items():
        for k, v in hp.items():
            meta[f"{name}.{k}"] = repr(float(v))
    safetensors_io.save(a.out, out, metadata=meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
