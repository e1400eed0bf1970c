#!/usr/bin/env python3
"""PyTorch on the same card: the GPU check's models trained by PyTorch, timed as mixtrain times them.

    scripts/torch_compare.py [--rows PATTERNS] [--steps 20] [--warmup 10] [--compile-budget 180]
                             [--time-budget S] [--device cuda|cpu] [--smoke] [--out FILE] [--dry-run]

Needs only PyTorch (whichever the machine has; torchvision optional). Each row
is one of mixtrain's gpu_check rows, named after its metrics file (the
summary puts them side by side, scripts/lib/compare_summary.py):

- resnet50: torchvision.models.resnet50 when importable, else the same network
  written out here (bottleneck v1.5, torchvision's names and initialisation);
  224 x 224 images, 1000 classes, momentum SGD (lr 0.05, momentum 0.9, no
  weight decay: mixtrain's defaults), batch 64 and 256;
- transformer: the Transformer-base row, nanoGPT's GPT (pre-LN blocks, causal
  attention through F.scaled_dot_product_attention when torch has it, exact
  GELU), 6 layers, d_model 512, 8 heads, context 256, vocabulary 32768, untied
  output layer as the row trains it, batch 32, AdamW (lr 0.05, betas 0.9,
  0.999, eps 1e-8, weight decay 0.01: mixtrain's defaults; fused on CUDA,
  as nanoGPT, and on the CPU where the torch fuses it there);
- gpt2: GPT-2 124M as nanoGPT builds it: 12 x 768, 12 heads, context 1024,
  vocabulary 50257 padded to 50304, tied embeddings, batch 8, AdamW.

Modes: amp (torch.autocast FP16 and GradScaler; channels_last for ResNet-50),
bf16 (BF16 autocast, no scaler; channels_last), fp32 (TF32 off), amp_compile
(amp with torch.compile of the model), bf16_compile (nanoGPT's defaults).
TF32 is off in every row (cuBLAS and cuDNN), as in mixtrain's, and read back;
cudnn.benchmark is on. Synthetic data made on the
device (256 images, or 256 sequences of random tokens, taken in turn). Each
row: WARMUP untimed steps, then STEPS steps, each timed from its start to a
torch.cuda.synchronize after it and the times added, as mixtrain's trainer
times its steps (it syncs to read each step's loss).
A torch.compile row runs in a child process, given --compile-budget seconds
for its warm-up (the compile): longer, and the row says so and the next runs.

Output: one JSON line per row on stdout and in --out FILE (appended as each
row ends): row, model, mode, batch, samples_per_s (and tokens_per_s), step_ms,
peak_bytes (torch.cuda.max_memory_allocated over the row, model and optimizer
included, less the synthetic data's data_bytes, as mixtrain's peak leaves out
its data set; peak_bytes_with_data keeps them), skipped_steps, warmup_loss_scale
and final_loss_scale (amp rows), flops_per_unit, achieved_tflops, peak_tflops, mfu, status (ok,
skipped, error) and error; then a readable table. MFU as scripts/lib/mfu.py
counts it (nanoGPT's 6N + 12LHQT per token; 3 x forward per image).

  --rows PATTERNS        comma-separated row names or shell patterns (default: all, in the order of --list)
  --list                 print the rows and exit
  --steps N              timed steps a row (default 20)
  --warmup N             untimed steps before them (default 10)
  --compile-budget S     seconds a torch.compile row may take to compile and warm up (default 180)
  --time-budget S        start no row after S seconds; each later row says so (default: none)
  --device DEV           cuda (default) or cpu
  --smoke                tiny models and batches (a CPU test of the script, not a figure)
  --resnet-impl WHICH    auto (torchvision if importable), torchvision or script (default auto)
  --peak-tflops X        the card's dense FP16/BF16 peak, for a card not in scripts/lib/mfu.py
  --gpu-name NAME        the card's name for the peak table (default: torch.cuda.get_device_name(0))
  --out FILE             also append the JSON lines to FILE
  --dry-run              print each row's model FLOPs and the peak, run nothing (no torch needed)
Exit status: 0 when every row ran or was skipped with a reason (PyTorch absent: every row says so),
1 when a row failed, 2 on a bad flag.
"""
import argparse
import contextlib
import fnmatch
import gc
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))
import mfu  # noqa: E402  (scripts/lib/mfu.py)

# (row, model, batch, mode), in the order they run: the figures of record
# first, torch.compile (slow to build) last, so that a short --time-budget
# cuts the extras. The names are mixtrain's metrics files in gpu_check
# (resnet50_amp.jsonl, ...), plus _compile for the torch.compile rows.
ROWS = [
    ("resnet50_amp", "resnet50", 64, "amp"),
    ("resnet50_fp32", "resnet50", 64, "fp32"),
    ("transformer_amp", "transformer", 32, "amp"),
    ("transformer_fp32", "transformer", 32, "fp32"),
    ("gpt2_amp", "gpt2", 8, "amp"),
    ("gpt2_fp32", "gpt2", 8, "fp32"),
    ("resnet50_amp_b256", "resnet50", 256, "amp"),
    ("resnet50_fp32_b256", "resnet50", 256, "fp32"),
    ("resnet50_bf16", "resnet50", 64, "bf16"),
    ("transformer_bf16", "transformer", 32, "bf16"),
    ("gpt2_bf16", "gpt2", 8, "bf16"),
    # torch.compile last, GPT-2 first: a short budget reaches the rows in this order.
    ("gpt2_amp_compile", "gpt2", 8, "amp_compile"),
    ("resnet50_amp_compile", "resnet50", 64, "amp_compile"),
    ("transformer_amp_compile", "transformer", 32, "amp_compile"),
    ("resnet50_amp_b256_compile", "resnet50", 256, "amp_compile"),
    # nanoGPT's own defaults: BF16 and torch.compile.
    ("gpt2_bf16_compile", "gpt2", 8, "bf16_compile"),
    ("transformer_bf16_compile", "transformer", 32, "bf16_compile"),
]
# --smoke: the same code on tiny shapes (batch 2, or 4 for the batch-256 rows): these replace mfu.MODELS' values.
SMOKE = {
    "resnet50": {"image": 32, "classes": 10},
    "transformer": {"layers": 2, "d_model": 64, "heads": 4, "context": 32, "vocab": 256, "vocab_real": 256},
    "gpt2": {"layers": 2, "d_model": 64, "heads": 2, "context": 64, "vocab": 320, "vocab_real": 300},
}
POOL = 256  # synthetic samples a row cycles through (mixtrain's --synthetic-size 256)
LR = 0.05  # mixtrain's default --lr, which the gpu_check rows keep
# A test hook: "compile" by sleeping this many seconds in the first call, for a torch without torch.compile.
COMPILE_STUB = "MIX_TORCH_COMPARE_COMPILE_STUB"
WARM_MARK = "torch_compare: warm "


def select_rows(patterns):
    """The rows of ROWS whose names match PATTERNS (comma-separated names or shell patterns), in ROWS' order."""
    names = [s.strip() for s in patterns.split(",") if s.strip()]
    return [r for r in ROWS if any(fnmatch.fnmatchcase(r[0], pat) for pat in names)]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="scripts/torch_compare.py", add_help=False)
    p.add_argument("-h", "--help", action="store_true")
    p.add_argument("--rows", default="*")
    p.add_argument("--list", action="store_true")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--compile-budget", type=float, default=180.0)
    p.add_argument("--time-budget", type=float, default=None)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--resnet-impl", default="auto", choices=("auto", "torchvision", "script"))
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--gpu-name", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one row, in a child process

    def refuse(message):
        print(f"torch_compare: {message} (see --help)", file=sys.stderr)
        sys.exit(2)

    p.error = refuse
    args = p.parse_args(argv)
    if args.help:
        doc = __doc__.strip().splitlines()
        print("usage: " + doc[2].strip())
        print("\n".join(doc[3:]))
        sys.exit(0)
    if args.steps < 1 or args.warmup < 0:
        refuse("--steps must be at least 1 and --warmup at least 0")
    if args.compile_budget <= 0 or (args.time_budget is not None and args.time_budget < 0):
        refuse("--compile-budget must be positive and --time-budget not negative")
    args.selected = select_rows(args.rows)
    if not args.selected:
        refuse(f"--rows '{args.rows}' matches no row; rows: {', '.join(r[0] for r in ROWS)}")
    return args


def model_config(model, smoke):
    return dict(mfu.MODELS[model], **(SMOKE[model] if smoke else {}))


def row_batch(batch, smoke):
    return (4 if batch > 64 else 2) if smoke else batch


def flops_fields(model, cfg, batch, rate_per_s, peak):
    """The row's FLOPs and MFU fields (rate_per_s: images/s or tokens/s)."""
    flops, unit = mfu.flops_per_unit(cfg)
    per_step = flops * batch * (cfg["context"] if cfg["kind"] == "gpt" else 1)
    out = {"unit": unit, "flops_per_unit": flops, "flops_per_step": per_step}
    if rate_per_s is not None:
        out["achieved_tflops"] = rate_per_s * flops / 1e12
        out["mfu"] = mfu.mfu(rate_per_s, flops, peak)
    return out


# ---------------------------------------------------------------------------------------------------------------
# The models, built only once torch is imported (build_models(torch) returns the classes).


def build_models(torch):
    nn, F = torch.nn, torch.nn.functional
    sdpa = getattr(F, "scaled_dot_product_attention", None)

    class CausalSelfAttention(nn.Module):
        def __init__(self, d, heads, context):
            super().__init__()
            self.heads = heads
            self.c_attn = nn.Linear(d, 3 * d)
            self.c_proj = nn.Linear(d, d)
            if sdpa is None:
                self.register_buffer("bias", torch.tril(torch.ones(context, context, dtype=torch.bool)),
                                     persistent=False)

        def forward(self, x):
            B, T, d = x.shape
            q, k, v = self.c_attn(x).split(d, dim=2)
            q, k, v = (t.view(B, T, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
            if sdpa is not None:
                y = sdpa(q, k, v, is_causal=True)
            else:  # nanoGPT's "slow attention" for a torch without scaled_dot_product_attention
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(~self.bias[:T, :T], float("-inf"))
                y = F.softmax(att, dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, d))

    class MLP(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.c_fc = nn.Linear(d, 4 * d)
            self.gelu = nn.GELU()
            self.c_proj = nn.Linear(4 * d, d)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self, d, heads, context):
            super().__init__()
            self.ln_1 = nn.LayerNorm(d)
            self.attn = CausalSelfAttention(d, heads, context)
            self.ln_2 = nn.LayerNorm(d)
            self.mlp = MLP(d)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        """nanoGPT's GPT (bias on, no dropout), its names and initialisation."""

        def __init__(self, cfg):
            super().__init__()
            d, L = cfg["d_model"], cfg["layers"]
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(cfg["vocab"], d), wpe=nn.Embedding(cfg["context"], d),
                h=nn.ModuleList(Block(d, cfg["heads"], cfg["context"]) for _ in range(L)), ln_f=nn.LayerNorm(d)))
            self.lm_head = nn.Linear(d, cfg["vocab"], bias=False)
            if cfg["tied"]:
                self.transformer.wte.weight = self.lm_head.weight
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
                elif p.dim() == 2:
                    nn.init.normal_(p, 0.0, 0.02)
                elif name.endswith(".bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            pos = torch.arange(idx.size(1), device=idx.device)
            x = self.transformer.wte(idx) + self.transformer.wpe(pos)
            for block in self.transformer.h:
                x = block(x)
            logits = self.lm_head(self.transformer.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    class Bottleneck(nn.Module):
        """torchvision's Bottleneck (v1.5: the stride on the 3x3)."""

        def __init__(self, inplanes, planes, stride, downsample):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    class ResNet50(nn.Module):
        """torchvision's resnet50(): the same modules, names and initialisation."""

        def __init__(self, num_classes=1000):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
            inplanes = 64
            for i, (planes, blocks, stride) in enumerate(((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))):
                layers = []
                for b in range(blocks):
                    s = stride if b == 0 else 1
                    down = None
                    if b == 0 and (s != 1 or inplanes != planes * 4):
                        down = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride=s, bias=False),
                                             nn.BatchNorm2d(planes * 4))
                    layers.append(Bottleneck(inplanes, planes, s, down))
                    inplanes = planes * 4
                setattr(self, f"layer{i + 1}", nn.Sequential(*layers))
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(2048, num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return GPT, ResNet50


def make_resnet50(torch, impl, classes):
    """(model, which implementation)."""
    if impl in ("auto", "torchvision"):
        try:
            import torchvision
            return torchvision.models.resnet50(num_classes=classes), f"torchvision {torchvision.__version__}"
        except Exception as e:  # absent, or built for another torch (its ops fail to register on import)
            if impl == "torchvision":
                raise
            why = f"; torchvision unusable: {type(e).__name__}: {first_line(e)}"
            return build_models(torch)[1](classes), f"written out (torchvision's resnet50){why}"
    return build_models(torch)[1](classes), "written out (torchvision's resnet50)"


def turn_tf32_off(torch):
    """Turns TF32 off for cuBLAS and cuDNN, then reads back what this torch will do, by the API it has.
    Torch 2.9 on keeps a precision per backend and op, which its legacy flags write, but the cuDNN flag
    leaves conv and rnn at "none", which defers to a generic setting: there each op is also set to
    "ieee" itself. Earlier torches keep the two flags. Raises when an op still says TF32; returns the
    state read, e.g. {"matmul": "ieee", "conv": "ieee", "rnn": "ieee"}."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if hasattr(torch, "set_float32_matmul_precision"):
        torch.set_float32_matmul_precision("highest")
    precision_of = getattr(torch._C, "_get_fp32_precision_getter", None)
    if precision_of is None:
        state = {"matmul": "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee",
                 "conv": "tf32" if torch.backends.cudnn.allow_tf32 else "ieee"}
    else:
        for setting in (torch.backends.cuda.matmul, torch.backends.cudnn.conv, torch.backends.cudnn.rnn):
            setting.fp32_precision = "ieee"
        state = {op: precision_of("cuda", op) for op in ("matmul", "conv", "rnn")}
    still_on = [op for op, value in state.items() if value == "tf32"]
    if still_on:
        raise RuntimeError(f"TF32 still on for {', '.join(still_on)} after turning it off: {state}")
    return state


def first_line(e, limit=200):
    """The line of an exception's message that says what failed: the last non-empty one (torch.compile's
    BackendCompilerFailed puts the cause after a first line naming the backend), cut at `limit`."""
    text = [line.strip() for line in str(e).splitlines() if line.strip()]
    return text[-1][:limit] if text else ""


# ---------------------------------------------------------------------------------------------------------------
# One row.


def compile_fn(torch):
    """torch.compile, or the test hook's stand-in, or None when this torch has neither."""
    stub = os.environ.get(COMPILE_STUB)
    if stub is not None:
        def fake(model):
            slept = []

            def call(*a):
                if not slept:
                    time.sleep(float(stub))
                    slept.append(1)
                return model(*a)
            return call
        return fake
    return getattr(torch, "compile", None)


def train_setup(torch, model_name, cfg, batch, mode, args):
    """(step function, notes): builds the model, optimizer and synthetic data on the device."""
    dev = torch.device(args.device)
    amp = mode.startswith("amp")
    notes = {}
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    if cfg["kind"] == "resnet50":
        model, notes["impl"] = make_resnet50(torch, args.resnet_impl, cfg["classes"])
        fmt = torch.channels_last if mode != "fp32" else torch.contiguous_format
        model = model.to(dev, memory_format=fmt)
        pool = max(POOL if not args.smoke else 2 * batch, batch)
        xs = torch.randn(pool, 3, cfg["image"], cfg["image"], device=dev, generator=gen)
        xs = xs.contiguous(memory_format=fmt)
        ys = torch.randint(cfg["classes"], (pool,), device=dev, generator=gen)
        notes["layout"] = "channels_last" if fmt is torch.channels_last else "NCHW"
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        notes["optimizer"] = "SGD(momentum 0.9)"
        loss_of = lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y)  # noqa: E731
    else:
        GPT = build_models(torch)[0]
        model = GPT(cfg).to(dev)
        pool = max(POOL if not args.smoke else 2 * batch, batch)
        xs = torch.randint(cfg["vocab_real"], (pool, cfg["context"]), device=dev, generator=gen)
        ys = torch.randint(cfg["vocab_real"], (pool, cfg["context"]), device=dev, generator=gen)
        notes["attention"] = ("F.scaled_dot_product_attention" if hasattr(torch.nn.functional,
                              "scaled_dot_product_attention") else "written out (no scaled_dot_product_attention)")
        opt, notes["optimizer"] = make_adamw(torch, model)
        loss_of = lambda m, x, y: m(x, y)  # noqa: E731
    notes["data_bytes"] = xs.element_size() * xs.nelement() + ys.element_size() * ys.nelement()
    model.train()
    forward = model
    if mode.endswith("_compile"):
        forward = compile_fn(torch)(model)
    scaler = make_grad_scaler(torch, dev.type) if amp else None
    dtype = {"amp": torch.float16, "bf16": torch.bfloat16}.get(mode.replace("_compile", ""))
    autocast = (lambda: torch.autocast(dev.type, dtype=dtype)) if dtype else contextlib.nullcontext
    state = {"i": 0}

    def step():
        i = state["i"]
        state["i"] = i + batch if i + 2 * batch <= pool else 0
        x, y = xs[i:i + batch], ys[i:i + batch]
        with autocast():
            loss = loss_of(forward, x, y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)

    return step, scaler, notes


def make_adamw(torch, model):
    """(AdamW, its description): fused wherever this torch fuses it for the parameters' device (CUDA
    since torch 2.0, the CPU since 2.4), else the default implementation. nanoGPT fuses it on CUDA; on
    the CPU this script fuses it too, so that a CPU run of a recent torch goes through the fused path,
    which GradScaler treats apart, that the GPU run takes."""
    kwargs = dict(lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    if "fused" not in _signature(torch.optim.AdamW):
        return torch.optim.AdamW(model.parameters(), **kwargs), "AdamW"
    try:
        return torch.optim.AdamW(model.parameters(), fused=True, **kwargs), "AdamW(fused)"
    except RuntimeError as e:  # this torch fuses it for CUDA only
        return torch.optim.AdamW(model.parameters(), **kwargs), f"AdamW (not fused here: {first_line(e, 120)})"


def has_device_grad_scaler(torch):
    """Whether this torch has torch.amp.GradScaler(device) (2.3 on), not torch.cuda.amp's alone."""
    return hasattr(getattr(torch, "amp", None), "GradScaler")


def make_grad_scaler(torch, device_type):
    """FP16's GradScaler for the device; before torch 2.3 there is torch.cuda.amp.GradScaler alone, for
    CUDA."""
    if has_device_grad_scaler(torch):
        scaler = torch.amp.GradScaler(device_type)
    elif device_type == "cuda":
        scaler = torch.cuda.amp.GradScaler()
    else:  # run_row skips such a row first; FP16 must never run unscaled
        raise RuntimeError(f"no GradScaler for {device_type} in torch {torch.__version__}")
    if not scaler.is_enabled():  # it would warn and pass FP16 gradients through unscaled: not PyTorch's AMP
        raise RuntimeError(f"GradScaler for {device_type} is disabled in torch {torch.__version__}")
    return scaler


def _signature(fn):
    import inspect
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}


def run_row(torch, row, args, peak, announce=None):
    """Trains one row; returns its JSON dict (status ok / skipped / error)."""
    name, model_name, batch, mode = row
    cfg = model_config(model_name, args.smoke)
    batch = row_batch(batch, args.smoke)
    rec = base_record(row, cfg, batch, args)
    if mode.startswith("amp") and args.device != "cuda" and not has_device_grad_scaler(torch):
        return dict(rec, status="skipped", error=f"cuda only in torch {torch.__version__}: FP16 autocast with "
                                                 "GradScaler")
    if mode.endswith("_compile") and compile_fn(torch) is None:
        return dict(rec, status="skipped", error=f"no torch.compile in torch {torch.__version__}")
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    try:
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(0)
        step, scaler, notes = train_setup(torch, model_name, cfg, batch, mode, args)
        rec.update(notes)
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            step()
        sync()
        rec["warmup_s"] = time.perf_counter() - t0
        if announce:
            announce(rec["warmup_s"])
        scale0 = scaler.get_scale() if scaler is not None else None
        # Each step timed to its synchronize and the times added, as mixtrain's trainer times its steps
        # (it reads the loss after every step, as nanoGPT and llm.c do): the host's queueing of a step
        # cannot overlap the previous one's kernels on either side.
        secs = 0.0
        for _ in range(args.steps):
            t0 = time.perf_counter()
            step()
            sync()
            secs += time.perf_counter() - t0
        if scaler is not None:  # each overflow halves the scale; it grows only after 2000 clean steps
            rec["skipped_steps"] = max(0, round(math.log2(scale0 / scaler.get_scale())))
            rec["warmup_loss_scale"] = scale0
            rec["final_loss_scale"] = scaler.get_scale()
        rec["step_ms"] = 1e3 * secs / args.steps
        rec["samples_per_s"] = batch * args.steps / secs
        rate = rec["samples_per_s"]
        if cfg["kind"] == "gpt":
            rec["tokens_per_s"] = rate = rec["samples_per_s"] * cfg["context"]
        rec["rate"] = rate
        rec.update(flops_fields(model_name, cfg, batch, rate, peak))
        if cuda:  # the synthetic data left out, as mixtrain's peak_bytes leaves out its data set
            rec["peak_bytes_with_data"] = torch.cuda.max_memory_allocated()
            rec["peak_bytes"] = rec["peak_bytes_with_data"] - notes["data_bytes"]
            rec["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        rec["status"] = "ok"
        return rec
    except Exception as e:  # an out-of-memory or an op this torch lacks: the row says it, the next runs
        return dict(rec, status="error", error=f"{type(e).__name__}: {first_line(e, 300)}")
    finally:
        step = scaler = None
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


def base_record(row, cfg, batch, args):
    name, model_name, _, mode = row
    rec = {"row": name, "model": model_name, "mode": mode, "batch": batch, "device": args.device,
           "smoke": args.smoke, "steps": args.steps, "warmup": args.warmup, "config": cfg,
           "status": None, "error": None}
    rec.update(flops_fields(model_name, cfg, batch, None, None))
    return rec


def run_child(row, args, peak, budget_left):
    """A torch.compile row in a child process: its warm-up must end within --compile-budget, the whole row
    within budget_left (None: no limit). Returns the row's dict."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--rows", row[0], "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--device", args.device, "--resnet-impl", args.resnet_impl,
           "--compile-budget", str(args.compile_budget)]
    cmd += ["--smoke"] if args.smoke else []
    cmd += ["--peak-tflops", str(peak)] if peak else []
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines, warm, err = [], threading.Event(), []
    threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True).start()

    def read():
        for line in p.stdout:
            if line.startswith(WARM_MARK):
                warm.set()
            else:
                lines.append(line)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def kill():
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                return
            try:
                p.wait(5)
                return
            except subprocess.TimeoutExpired:
                continue

    first = args.compile_budget if budget_left is None else min(args.compile_budget, budget_left)
    while not warm.is_set() and p.poll() is None and time.monotonic() - t0 < first:
        warm.wait(0.2)
    rec = base_record(row, model_config(row[1], args.smoke), row_batch(row[2], args.smoke), args)
    if not warm.is_set() and p.poll() is None:
        kill()
        why = (f"did not compile within --compile-budget {args.compile_budget:g} s" if first == args.compile_budget
               else f"did not compile within the {first:.0f} s left of --time-budget")
        return dict(rec, status="skipped", error=why)
    try:
        p.wait(None if budget_left is None else max(1.0, budget_left - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        kill()
        return dict(rec, status="skipped", error="compiled, but its timed steps ran past --time-budget")
    reader.join(5)
    for line in reversed(lines):
        try:
            out = json.loads(line)
            out["compile_s"] = out.get("warmup_s")
            return out
        except ValueError:
            continue
    tail = (err[0] if err else "").strip().splitlines()[-1:] or [f"exit {p.returncode}"]
    return dict(rec, status="error", error=f"the child process gave no row: {tail[0][:300]}")


# ---------------------------------------------------------------------------------------------------------------


def fmt_rate(r):
    if r.get("status") != "ok":
        return f"{r.get('status')}: {r.get('error')}"
    unit = "tok/s" if r.get("unit") == "token" else "img/s"
    m = r.get("mfu")
    mfu_s = f"{100 * m:5.1f}%" if m is not None else "  n/a"
    peak = r.get("peak_bytes")
    peak_s = f"{peak / 2**20:8.0f} MiB" if peak else "       n/a"
    return f"{r['rate']:12.1f} {unit}  {r['step_ms']:8.2f} ms  MFU {mfu_s}  peak {peak_s}"


def table(records, header):
    lines = [header]
    for r in records:
        lines.append(f"  {r['row']:28s} b{r['batch']:<4d} {r['flops_per_unit'] / 1e9:8.3f} GF/{r['unit']:5s} "
                     f"{fmt_rate(r)}")
    return "\n".join(lines)


def main(argv):
    args = parse_args(argv)
    if args.list:
        for name, model, batch, mode in ROWS:
            print(f"{name:28s} {model:12s} batch {batch:<4d} {mode}")
        return 0
    t_start = time.monotonic()
    out = open(args.out, "a") if args.out else None

    def emit(rec):
        line = json.dumps(rec, sort_keys=True)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    torch, why_not, fp32_not = None, None, None
    if not args.dry_run:
        try:
            import torch
        except Exception as e:  # not installed, or a broken install: every row says so
            why_not = f"PyTorch not importable: {type(e).__name__}: {e}"
    fp32_state = None
    if torch is not None:  # true FP32 wherever FP32 is computed, as mixtrain's rows; cuDNN picks by timing
        try:
            torch.backends.cudnn.benchmark = True
            fp32_state = turn_tf32_off(torch)
        except Exception as e:  # a torch whose settings moved: its FP32 rows would not be mixtrain's FP32
            fp32_not = f"torch {torch.__version__} refused TF32 off: {type(e).__name__}: {first_line(e)}"
    device_name, peak, peak_label = args.gpu_name or args.device, args.peak_tflops, "--peak-tflops"
    if torch is not None and args.device == "cuda":
        if not torch.cuda.is_available():
            why_not = f"torch {torch.__version__} sees no CUDA device"
        elif not args.gpu_name:
            device_name = torch.cuda.get_device_name(0)
    if peak is None:
        peak, peak_label = mfu.peak_tflops(device_name) if args.device == "cuda" else (None, "no peak for the CPU")
    if args.child:  # one row, the WARM_MARK line once warm, then its JSON line
        if why_not or (fp32_not and args.selected[0][3] == "fp32"):
            print(why_not or fp32_not, file=sys.stderr)
            return 1

        def announce(secs):
            print(f"{WARM_MARK}{secs:.1f}", flush=True)
        rec = run_row(torch, args.selected[0], args, peak, announce)
        rec.update(device_name=device_name, torch=torch.__version__, peak_tflops=peak)
        print(json.dumps(rec, sort_keys=True), flush=True)
        return 0
    about = {"device_name": device_name, "peak_tflops": peak, "peak_what": peak_label,
             "torch": getattr(torch, "__version__", None), "fp32_precision": fp32_state, "tf32_refused": fp32_not}
    records, failed = [], False
    for row in args.selected:
        cfg = model_config(row[1], args.smoke)
        batch = row_batch(row[2], args.smoke)
        if args.dry_run:
            rec = dict(base_record(row, cfg, batch, args), status="skipped", error="--dry-run")
        elif why_not or (fp32_not and row[3] == "fp32"):
            rec = dict(base_record(row, cfg, batch, args), status="skipped", error=why_not or fp32_not)
        else:
            elapsed = time.monotonic() - t_start
            left = None if args.time_budget is None else args.time_budget - elapsed
            if left is not None and left <= 0:
                rec = dict(base_record(row, cfg, batch, args), status="skipped",
                           error=f"not run: past --time-budget {args.time_budget:g} s")
            elif row[3].endswith("_compile") and compile_fn(torch) is not None:
                rec = run_child(row, args, peak, left)
            else:
                rec = run_row(torch, row, args, peak)
        rec.update(about)
        failed |= rec["status"] == "error"
        records.append(rec)
        emit(rec)
    print(table(records, f"torch_compare: torch {about['torch'] or '(none)'} on {device_name}, dense FP16/BF16 peak "
                         f"{peak if peak else 'unknown'} TFLOPS ({peak_label}); {args.warmup} warm-up + "
                         f"{args.steps} timed steps a row"))
    for line in mfu.describe_flops():
        print("  model FLOPs, " + line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
