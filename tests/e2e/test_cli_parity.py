#!/usr/bin/python3
"""End-to-end parity of the mixtrain command line with PyTorch.

Writes a small data set (`inputs` F32 [N, F], `labels` I64 [N]) and an initial
model (a PyTorch state_dict of fc1/fc2/fc3 nn.Linear layers, saved with
tests/python/safetensors_io.py), then for each optimizer case runs

    mixtrain --precision fp32 --data-file DATA --init-from INIT --shuffle false --steps 5
             --batch-size 32 --optimizer OPT --lr LR [--weight-decay WD] --hidden H1,H2
             --save OUT --metrics METRICS --eval false

and the same 5 steps in PyTorch: with --shuffle false, rank 0 of a world of 1 takes
the examples in order 0..N-1 in batches of 32, and N = 150 makes the 5th batch a
partial one of 22 (its loss is the mean over 22). The test compares the saved
parameters, the optimizer state mixtrain saves (`optimizer.momentum_buffer.<p>`,
`optimizer.exp_avg.<p>`, `optimizer.exp_avg_sq.<p>`, `optimizer.step`) with torch's
optimizer state, and the per-step losses of the metrics file with torch's. One
case adds --warmup-steps 3, torch's LambdaLR with the same factors: the rate each
step trains at, and the `lr` each metrics line reports, must be torch's.

Tolerances (FP32 on both sides, different summation orders; see
tests/unit/test_mlp_parity.cc for the derivation, measured errors are ~1e-8):
  - parameters: |diff| <= 1e-6 + 1e-5 |want|. One step moves a parameter by
    lr |update| ~ 1e-4..1e-3 here, so a wrong batch, order, step count or
    optimizer formula is far outside; FP32 rounding (~1e-7 |p|) is far inside.
  - gradient-like state (momentum buffer, exp_avg): 1e-5 max|want| + 1e-4 |want|:
    sums of terms of either sign keep an error relative to their terms' size.
  - exp_avg_sq (squares of gradients): 1e-5 max|want| + 2e-4 |want|.
  - losses: 1e-6 + 1e-5 |want|.
  - AdamW only: a parameter whose torch gradient at some step was nonzero but
    within 1e-5 max|grad| of zero has no reliable sign, and AdamW moves it by
    ~lr * sign(g) whatever |g| is; such elements may differ by 2 lr per step and
    must be rare (at most 0.5% of a tensor, plus 2).

Exit status: 0 when everything matches, 1 on a mismatch (the worst element of
each failing tensor is printed) or when something needed is missing.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "python"))

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"FAIL: {sys.executable} cannot import numpy/torch ({e}); the PyTorch parity tests need Debian's "
          "python3-numpy and python3-torch: run scripts/setup.sh and use /usr/bin/python3")
    sys.exit(1)

import safetensors_io  # noqa: E402

N, FEATURES, HIDDEN, CLASSES = 150, 40, (32, 16), 6
BATCH, STEPS, SEED = 32, 5, 7

def decay_groups(params, weight_decay):
    """--no-decay-1d as torch param groups: matrices decay, biases (1-D) do not."""
    params = list(params)
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


CASES = [
    # name, mixtrain flags, torch optimizer factory, {mixtrain state slot: torch state key}
    ("momentum", ["--optimizer", "momentum", "--lr", "0.05"],
     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), {"momentum_buffer": "momentum_buffer"}),
    ("momentum+wd", ["--optimizer", "momentum", "--lr", "0.05", "--momentum", "0.8", "--weight-decay", "5e-4"],
     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, weight_decay=5e-4), {"momentum_buffer": "momentum_buffer"}),
    # No --weight-decay: adamw's default is torch.optim.AdamW's, 0.01 (it shrinks a
    # parameter by lr * 0.01 = 1e-5 of itself a step, 5e-5 over the 5 steps, outside
    # PARAM_TOL for the init's |p| ~ 0.1, so a default of 0 would fail).
    ("adamw", ["--optimizer", "adamw", "--lr", "0.001"],
     lambda ps: torch.optim.AdamW(ps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
     {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}),
    # The decay shrinks a parameter by lr * wd of itself a step: 1e-4 (AdamW) and
    # 2.5e-3 (SGD, before momentum), far outside PARAM_TOL's relative 1e-5, so
    # decaying the biases, or not decaying the matrices, would fail.
    ("adamw+no-decay-1d", ["--optimizer", "adamw", "--lr", "0.001", "--weight-decay", "0.1", "--no-decay-1d"],
     lambda ps: torch.optim.AdamW(decay_groups(ps, 0.1), lr=1e-3, betas=(0.9, 0.999), eps=1e-8),
     {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}),
    ("momentum+no-decay-1d", ["--optimizer", "momentum", "--lr", "0.05", "--weight-decay", "0.05", "--no-decay-1d"],
     lambda ps: torch.optim.SGD(decay_groups(ps, 0.05), lr=0.05, momentum=0.9), {"momentum_buffer": "momentum_buffer"}),
    # An optional fifth entry: torch's LambdaLR factor of step k (0-based). mixtrain's warm-up
    # goes linearly from lr/W to lr over W steps: step k trains at lr * (k + 1) / W, so the
    # steps' rates here are lr/3, 2lr/3, lr, lr, lr; a rate one step ahead or behind moves
    # every parameter by a third of an update or more.
    ("momentum+warmup", ["--optimizer", "momentum", "--lr", "0.05", "--warmup-steps", "3"],
     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), {"momentum_buffer": "momentum_buffer"},
     lambda k: min(1.0, (k + 1) / 3)),
    # An optional sixth entry: the clip, as torch.nn.utils applies it after backward.
    # lr 0.5 and C = 0.05: the gradients' norm (~1 here) is above C at every step, so
    # the clip bites every step (the test checks torch's norms), and an unclipped or
    # wrongly clipped step moves the parameters by far more than PARAM_TOL.
    ("momentum+clip-grad-norm", ["--optimizer", "momentum", "--lr", "0.5", "--clip-grad-norm", "0.05"],
     lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.9), {"momentum_buffer": "momentum_buffer"}, None,
     ("norm", 0.05)),
    ("sgd+clip-grad-value", ["--optimizer", "sgd", "--lr", "0.5", "--clip-grad-value", "0.01"],
     lambda ps: torch.optim.SGD(ps, lr=0.5), {}, None, ("value", 0.01)),
]

PARAM_TOL = (1e-6, 0.0, 1e-5)  # (abs, times max|want|, rel)
STATE_TOL = {"momentum_buffer": (0.0, 1e-5, 1e-4), "exp_avg": (0.0, 1e-5, 1e-4), "exp_avg_sq": (0.0, 1e-5, 2e-4)}
LOSS_TOL = (1e-6, 0.0, 1e-5)
GRAD_SIGN_TOL = 1e-5  # times max|grad| of the tensor


from mlp_reference import Mlp  # noqa: E402  (the reference MLP, state_dict names fc1..fcL)


def batches():
    """The example indices of each step, as mixtrain's DistributedSampler (rank 0 of 1, no shuffle) gives them."""
    per_epoch = (N + BATCH - 1) // BATCH
    for step in range(STEPS):
        begin = (step % per_epoch) * BATCH
        yield np.arange(begin, min(begin + BATCH, N))


def torch_run(init, x, y, make_opt, lr_lambda=None, clip=None):
    """STEPS steps in torch; returns (state_dict, optimizer state by param name, losses, ambiguous-sign masks,
    each step's learning rate, each step's gradient norm before any clip)."""
    model = Mlp((FEATURES, *HIDDEN, CLASSES))
    model.load_state_dict({k: torch.from_numpy(v) for k, v in init.items()})
    opt = make_opt(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda) if lr_lambda else None
    lrs = []
    names = {id(p): n for n, p in model.named_parameters()}
    losses, norms = [], []
    ambiguous = {n: np.zeros(p.shape, bool) for n, p in model.named_parameters()}
    for idx in batches():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(torch.from_numpy(x[idx])), torch.from_numpy(y[idx]))
        loss.backward()
        losses.append(loss.item())
        # clip_grad_norm_'s total norm: the norm of the parameters' gradient norms.
        norms.append(torch.norm(torch.stack([torch.norm(p.grad.detach(), 2) for p in model.parameters()]), 2).item())
        if clip and clip[0] == "value" and not max(p.grad.abs().max().item() for p in model.parameters()) > clip[1]:
            raise AssertionError(f"no gradient element is above V = {clip[1]} at step {len(losses)}: the clip does "
                                 "not bite")
        if clip and clip[0] == "norm":
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip[1])
        elif clip and clip[0] == "value":
            torch.nn.utils.clip_grad_value_(model.parameters(), clip[1])
        for n, p in model.named_parameters():
            g = p.grad.detach().numpy()
            ambiguous[n] |= (g != 0) & (np.abs(g) <= GRAD_SIGN_TOL * np.abs(g).max())
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if sched:
            sched.step()
    state = {}
    for p, s in opt.state.items():
        state[names[id(p)]] = {k: (v.detach().numpy().copy() if torch.is_tensor(v) else v) for k, v in s.items()}
    params = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return params, state, losses, ambiguous, lrs, norms


def compare(what, got, want, tol, failures, allow=None, allow_diff=0.0, report=None):
    """Elementwise |got - want| <= abs + of_max max|want| + rel |want|; `allow` marks elements allowed `allow_diff`."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        failures.append(f"{what}: shape {list(got.shape)}, torch has {list(want.shape)}")
        return
    a, of_max, rel = tol
    allowed = a + of_max * (np.abs(want).max() if want.size else 0.0) + rel * np.abs(want)
    diff = np.abs(got - want)
    bad = ~(diff <= allowed)
    lenient = 0
    if allow is not None and allow.any():
        lenient = int((bad & allow).sum())
        loose_bad = allow & ~(diff <= allowed + allow_diff)
        bad = (bad & ~allow) | loose_bad
        limit = 2 + allow.size // 200
        if int(allow.sum()) > limit:
            failures.append(f"{what}: {int(allow.sum())} elements have a gradient of no reliable sign (at most "
                            f"{limit} expected): is the data degenerate?")
    ratio = np.where(allowed > 0, diff / np.maximum(allowed, 1e-300), np.inf)
    worst = np.unravel_index(int(np.nanargmax(np.where(np.isnan(diff), np.inf, ratio))), want.shape) if want.size else ()
    line = (f"{what}: max |diff| {diff.max() if diff.size else 0:.3g}, worst element {list(map(int, worst))} got "
            f"{got[worst]:.9g} want {want[worst]:.9g} (|diff| {diff[worst]:.3g}, allowed {allowed[worst]:.3g})")
    if lenient:
        line += f"; {lenient} sign-ambiguous element(s) over the strict tolerance, within 2 lr per step"
    if report is not None:
        report.append(line)
    if bad.any():
        failures.append(f"{int(bad.sum())} of {bad.size} elements out of tolerance (abs {a} + {of_max} max|want| + "
                        f"rel {rel}) -- {line}")


def main():
    build = Path(os.environ.get("MIX_BUILD_DIR", HERE.parents[2] / "build"))
    mixtrain = build / "mixtrain"
    if not os.access(mixtrain, os.X_OK):
        print(f"FAIL: {mixtrain} is not built (set MIX_BUILD_DIR to the build directory)")
        return 1
    verbose = os.environ.get("MIX_PARITY_VERBOSE", "0") not in ("", "0")

    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((N, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=N).astype(np.int64)
    y[0] = CLASSES - 1  # mixtrain takes the class count from the largest label
    init = {k: v.detach().numpy().copy() for k, v in Mlp((FEATURES, *HIDDEN, CLASSES)).state_dict().items()}

    all_failures = []
    with tempfile.TemporaryDirectory(prefix="mix_cli_parity_") as d:
        data_file, init_file = os.path.join(d, "data.safetensors"), os.path.join(d, "init.safetensors")
        safetensors_io.save(data_file, {"inputs": x, "labels": y})
        safetensors_io.save(init_file, init)
        for name, flags, make_opt, slots, *extra in CASES:
            lr_lambda = extra[0] if extra else None
            clip = extra[1] if len(extra) > 1 else None
            out, metrics = os.path.join(d, f"{name}.safetensors"), os.path.join(d, f"{name}.jsonl")
            cmd = [str(mixtrain), "--precision", "fp32", "--data", "safetensors", "--data-file", data_file,
                   "--init-from", init_file, "--shuffle", "false", "--steps", str(STEPS), "--batch-size", str(BATCH),
                   "--hidden", ",".join(map(str, HIDDEN)), "--save", out, "--metrics", metrics, "--eval", "false",
                   *flags]
            env = dict(os.environ, OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1"))
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
            if r.returncode != 0:
                all_failures.append(f"[{name}] mixtrain exited with {r.returncode}:\n  {' '.join(cmd)}\n"
                                    f"{r.stdout}{r.stderr}")
                continue
            saved, _ = safetensors_io.load(out)
            with open(metrics) as f:
                lines = [json.loads(l) for l in f if l.strip()]
            our_losses = [l["loss"] for l in lines if "loss" in l and not l.get("summary")]
            our_lrs = [l["lr"] for l in lines if "loss" in l and not l.get("summary")]
            our_norms = [l["grad_norm"] for l in lines if "loss" in l and not l.get("summary")]

            want_params, want_state, want_losses, ambiguous, want_lrs, want_norms = torch_run(
                init, x, y, make_opt, lr_lambda, clip)
            failures, report = [], []
            # Both in double: (k + 1) / 3 * lr here, lr * (k + 1) / 3 there, an ulp apart at most.
            if len(our_lrs) != STEPS or any(abs(a - b) > 1e-12 * b for a, b in zip(our_lrs, want_lrs)):
                failures.append(f"the metrics' learning rates {our_lrs} are not torch's {want_lrs}")
            for p, want in want_params.items():
                if p not in saved:
                    failures.append(f"the checkpoint has no parameter '{p}' (it has {sorted(saved)})")
                    continue
                lenient = name.startswith("adamw")
                lr = float(flags[flags.index("--lr") + 1])
                compare(f"parameter {p}", saved[p], want, PARAM_TOL, failures,
                        allow=ambiguous[p] if lenient else None, allow_diff=2 * lr * STEPS, report=report)
                for slot, key in slots.items():
                    sname = f"optimizer.{slot}.{p}"
                    if sname not in saved:
                        failures.append(f"the checkpoint has no optimizer state '{sname}'")
                        continue
                    compare(sname, saved[sname], want_state[p][key], STATE_TOL[slot], failures, report=report)
            if "optimizer.step" in saved:
                if int(np.asarray(saved["optimizer.step"]).reshape(-1)[0]) != STEPS:
                    failures.append(f"optimizer.step is {saved['optimizer.step']}, expected {STEPS}")
            else:
                failures.append("the checkpoint has no optimizer.step")
            if len(our_losses) != STEPS:
                failures.append(f"the metrics file has {len(our_losses)} step losses, expected {STEPS}")
            else:
                compare("per-step loss", our_losses, want_losses, LOSS_TOL, failures, report=report)
            # The metrics' grad_norm is torch's total_norm (before clipping), at every step.
            if len(our_norms) != STEPS or any(v is None for v in our_norms):
                failures.append(f"the metrics' grad_norm {our_norms}: not one finite value a step")
            else:
                compare("per-step grad_norm", our_norms, want_norms, LOSS_TOL, failures, report=report)
            if clip and clip[0] == "norm" and not all(v > clip[1] for v in want_norms):
                failures.append(f"torch's norms {want_norms} are not all above C = {clip[1]}: the clip does not bite")
            if verbose:
                for line in report:
                    print(f"[{name}] {line}")
            status = "ok" if not failures else f"{len(failures)} mismatch(es)"
            print(f"{name}: {status}; losses mixtrain {['%.6f' % v for v in our_losses]} torch "
                  f"{['%.6f' % v for v in want_losses]}")
            all_failures += [f"[{name}] {f}" for f in failures]

    if all_failures:
        print("FAIL: mixtrain and PyTorch disagree:")
        for f in all_failures:
            print("  " + f)
        return 1
    print(f"PASS: mixtrain matches PyTorch after {STEPS} steps ({', '.join(c[0] for c in CASES)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
