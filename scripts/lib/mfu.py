"""Model FLOPs and model FLOPs utilisation (MFU), written once for the GPU check's
mixtrain rows (scripts/lib/compare_summary.py) and scripts/torch_compare.py's
PyTorch rows. Pure Python: no torch, no numpy.

Conventions (docs/gpu.md, "mixtrain against PyTorch"):

- MFU = (rate x model FLOPs per unit) / the card's dense FP16/BF16 tensor-core
  peak, the same peak for every precision (an FP32 row's MFU is its share of
  the FP16 peak too). Model FLOPs count the matmuls and convolutions a
  training step needs, not what a kernel really executes (no recomputation,
  no padding, no normalisations, activations or optimizer).
- GPT (nanoGPT's estimate_mfu, the PaLM paper's appendix B): FLOPs per token
  = 6 N + 12 L H Q T, with N the parameters, L layers, H heads, Q head size,
  T context. N leaves out the position embedding (nanoGPT's
  get_num_params(non_embedding=True)); with tied embeddings the token
  embedding stays in N, as the output layer's weight; an untied model's token
  embedding, a lookup, is left out too, and its lm_head counted. The
  attention term counts the whole T x T score matrix, not the causal half.
- ResNet-50: FLOPs per image = 3 x forward, the forward being 2 FLOPs per
  multiply-add of every convolution and the fc layer (4.09 G multiply-adds at
  224 x 224: torchvision's "4.09 GFLOPS" are multiply-adds), so 8.18 GFLOPs
  forward and 24.5 GFLOPs a trained image; backward counts twice the forward
  (the data and the weight gradients, the stem's data gradient included).
"""
import math

# The models of the GPU check's rows. vocab is what the GEMMs see (GPT-2's
# 50,257 padded to 50,304, a multiple of 64, as nanoGPT and mixtrain's gpt2
# preset pad it); vocab_real is what the synthetic tokens are drawn from.
MODELS = {
    "resnet50": {"kind": "resnet50", "image": 224, "classes": 1000},
    # The gpu_check row: --layers 6 --d-model 512 --heads 8 --context 256 --vocab 32768, no --tie-weights.
    "transformer": {"kind": "gpt", "layers": 6, "d_model": 512, "heads": 8, "context": 256, "vocab": 32768,
                    "vocab_real": 32768, "tied": False},
    "gpt2": {"kind": "gpt", "layers": 12, "d_model": 768, "heads": 12, "context": 1024, "vocab": 50304,
             "vocab_real": 50257, "tied": True},
}

# Dense (no sparsity) FP16/BF16 tensor-core peaks in TFLOPS, NVIDIA's data
# sheets. Matched against the device name in order: the first pattern whose
# every word the name holds wins. NVL and other variants with other clocks
# are left unknown rather than guessed.
PEAKS = [
    (("h100", "nvl"), None, "H100 NVL: not in the table"),
    (("h200", "nvl"), None, "H200 NVL: not in the table"),
    (("h100", "pcie"), 756.0, "H100 PCIe"),
    (("h100",), 989.4, "H100 SXM"),
    (("h200",), 989.4, "H200"),
    (("a100",), 312.0, "A100"),
]


def peak_tflops(device_name):
    """(peak TFLOPS or None, what it is) for a device name as torch.cuda.get_device_name or nvidia-smi print it."""
    name = (device_name or "").lower()
    if not name:
        return None, "no device name"
    for words, peak, label in PEAKS:
        if all(w in name for w in words):
            return peak, label
    return None, f"unknown card '{device_name}': no dense FP16/BF16 peak in scripts/lib/mfu.py"


def gpt_params(cfg):
    """N of the FLOPs formula (module docstring): every parameter but the position embedding, and
    but the token embedding when it is not tied to the output layer."""
    d, L, V = cfg["d_model"], cfg["layers"], cfg["vocab"]
    block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d) + (4 * d * d + d)
    return L * block + 2 * d + V * d  # blocks, ln_f, and the output layer (wte when tied, lm_head when not)


def gpt_flops_per_token(cfg):
    """6 N + 12 L H Q T (nanoGPT's estimate_mfu): a training step's model FLOPs per token."""
    L, H, T = cfg["layers"], cfg["heads"], cfg["context"]
    Q = cfg["d_model"] // H
    return 6 * gpt_params(cfg) + 12 * L * H * Q * T


def _conv_out(size, kernel, stride, pad):
    return (size + 2 * pad - kernel) // stride + 1


def resnet50_forward_macs(image=224, classes=1000):
    """Multiply-adds of one image's forward pass: every convolution and the fc layer of torchvision's
    ResNet-50 (v1.5: the stride on the 3x3)."""
    macs = 0
    h = _conv_out(image, 7, 2, 3)
    macs += h * h * 64 * 3 * 7 * 7  # stem
    h = _conv_out(h, 3, 2, 1)  # max-pool
    inplanes = 64
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            s = stride if b == 0 else 1
            out = _conv_out(h, 3, s, 1)
            macs += h * h * inplanes * planes  # conv1 1x1
            macs += out * out * planes * planes * 9  # conv2 3x3, stride s
            macs += out * out * planes * planes * 4  # conv3 1x1
            if b == 0 and (s != 1 or inplanes != planes * 4):
                macs += out * out * inplanes * planes * 4  # downsample 1x1, stride s
            inplanes, h = planes * 4, out
    return macs + 2048 * classes


def resnet50_flops_per_image(image=224, classes=1000):
    """A training step's model FLOPs per image: 3 x (2 x forward multiply-adds)."""
    return 3 * 2 * resnet50_forward_macs(image, classes)


def flops_per_unit(cfg):
    """(model FLOPs per unit, unit): per token for a GPT, per image for ResNet-50."""
    if cfg["kind"] == "gpt":
        return gpt_flops_per_token(cfg), "token"
    return resnet50_flops_per_image(cfg["image"], cfg["classes"]), "image"


def mfu(rate, flops, peak):
    """Fraction of the peak (TFLOPS) that RATE units/s of FLOPS each reach; None when either is unknown."""
    try:
        rate, flops, peak = float(rate), float(flops), float(peak)
    except (TypeError, ValueError):
        return None
    if not (rate > 0 and flops > 0 and peak > 0) or math.isinf(rate):
        return None
    return rate * flops / (peak * 1e12)


def describe_flops():
    """One line per model of MODELS: its FLOPs per unit and how they are counted."""
    lines = []
    for name, cfg in MODELS.items():
        f, unit = flops_per_unit(cfg)
        if cfg["kind"] == "gpt":
            how = (f"6N + 12LHQT, N = {gpt_params(cfg) / 1e6:.2f}M "
                   f"({'tied' if cfg['tied'] else 'untied: lm_head counted, wte not'}; no wpe)")
        else:
            how = f"3 x forward, forward = 2 x {resnet50_forward_macs(cfg['image'], cfg['classes']) / 1e9:.2f} G MACs"
        lines.append(f"{name}: {f / 1e9:.3f} GFLOPs/{unit} ({how})")
    return lines
