#!/usr/bin/python3
"""Reference values of one GPT-style Transformer training step, computed by PyTorch, for
tests/unit/test_transformer_parity.cc.

    /usr/bin/python3 tests/python/transformer_reference.py OUT.safetensors [--layers 2] [--d-model 32]
        [--heads 4] [--context 16] [--vocab 64] [--batch 3] [--seed 0] [--tie-weights] [--sdpa]
        [--state-dict STATE.safetensors]

Builds, from torch.nn modules, nanoGPT's decoder-only LM (token and position embeddings,
pre-norm blocks h += attn(ln_1(h)); h += mlp(ln_2(h)) with causal multi-head self-attention
written out as q.k^T / sqrt(hd), a lower-triangular mask, softmax and att.v, an MLP
c_fc -> exact GELU -> c_proj, a final ln_f and a bias-free lm_head), with nanoGPT's module
names so that the state_dict names are mixtrain's (models/transformer.cc). No dropout.
--tie-weights computes the logits with transformer.wte.weight and has no lm_head (the
state_dict then holds the shared matrix once, as transformer.wte.weight). --sdpa computes the
attention with PyTorch's fused scaled_dot_product_attention (is_causal=True) instead, as
nanoGPT does where torch has it (the private _scaled_dot_product_attention of torch 1.13,
Debian's, else the public one). --tie-weights --sdpa is nanoGPT's GPT (mixtrain's --model
gpt2, whose padded vocabulary the reference does not have: the tests compare mixtrain's padded
model against this unpadded one). --state-dict also writes the initial state_dict alone, by
its plain names, as a PyTorch user would save it for mixtrain's --init-from. Initialisation as
nanoGPT's: Linear and Embedding weights N(0, 0.02), the residual projections (c_proj)
N(0, 0.02 / sqrt(2 layers)), biases 0, LayerNorm weight 1 and bias 0. Writes (via
tests/python/safetensors_io.py):

    init.<name>             the initial state_dict
    x, label                i64 [B, context] random tokens (label: the tokens to predict)
    loss, grad.<param>      the mean cross-entropy over all B * context tokens and the gradients
    logits                  f32 [B, context, vocab], the forward's output
    loss64, grad64.<param>, logits64
                            the same in float64 from the same float32 values, rounded to float32

with the configuration in the metadata (layers, d_model, heads, context, vocab, batch,
tie_weights, attention). Deterministic: seeded, torch.set_num_threads(2),
torch.use_deterministic_algorithms(True).
"""
import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import safetensors_io  # noqa: E402


def scaled_dot_product_attention(q, k, v):
    """softmax(q k^T / sqrt(hd), causal) v through PyTorch's fused op."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F._scaled_dot_product_attention(q, k, v, is_causal=True)[0]


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, context, sdpa):
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        # Not part of the state_dict (mixtrain's softmax applies the mask itself).
        self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        B, T, d = x.shape
        hd = d // self.heads
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in (q, k, v))  # [B, heads, T, hd]
        if self.sdpa:
            y = scaled_dot_product_attention(q, k, v)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, d)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU()  # exact (erf)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d, heads, context, sdpa):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, context, sdpa)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, layers, d, heads, context, vocab, tie_weights, sdpa=False):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d),
            wpe=nn.Embedding(context, d),
            h=nn.ModuleList([Block(d, heads, context, sdpa) for _ in range(layers)]),
            ln_f=nn.LayerNorm(d),
        ))
        self.lm_head = None if tie_weights else nn.Linear(d, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx):
        B, T = idx.shape
        pos = torch.arange(T, dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if self.lm_head is None:
            return F.linear(x, self.transformer.wte.weight)
        return self.lm_head(x)


def step(model, x, label):
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), label.reshape(-1))
    loss.backward()
    return logits.detach(), loss.detach()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tie-weights", action="store_true")
    ap.add_argument("--sdpa", action="store_true", help="attention through scaled_dot_product_attention")
    ap.add_argument("--state-dict", help="also write the initial state_dict here (safetensors, plain names)")
    a = ap.parse_args()

    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(a.seed)
    args = (a.layers, a.d_model, a.heads, a.context, a.vocab, a.tie_weights, a.sdpa)
    model = GPT(*args).float()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x = torch.randint(0, a.vocab, (a.batch, a.context))
    label = torch.randint(0, a.vocab, (a.batch, a.context))

    out = {f"init.{k}": v.numpy().copy() for k, v in init.items()}
    out["x"] = x.numpy()
    out["label"] = label.numpy()
    logits, loss = step(model, x, label)
    out["loss"] = np.array([loss.item()], np.float32)
    out["logits"] = logits.numpy().copy()
    for k, p in model.named_parameters():
        out[f"grad.{k}"] = p.grad.numpy().copy()

    m64 = GPT(*args).double()
    m64.load_state_dict({k: v.double() for k, v in init.items()})
    logits64, loss64 = step(m64, x, label)
    out["loss64"] = np.array([loss64.item()], np.float32)
    out["logits64"] = logits64.numpy().astype(np.float32)
    for k, p in m64.named_parameters():
        out[f"grad64.{k}"] = p.grad.numpy().astype(np.float32)

    meta = {"layers": str(a.layers), "d_model": str(a.d_model), "heads": str(a.heads), "context": str(a.context),
            "vocab": str(a.vocab), "batch": str(a.batch), "tie_weights": str(int(a.tie_weights)),
            "attention": "sdpa" if a.sdpa else "explicit",
            "torch": torch.__version__}
    safetensors_io.save(a.out, out, metadata=meta)
    if a.state_dict:
        safetensors_io.save(a.state_dict, {k: v.numpy().copy() for k, v in init.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
