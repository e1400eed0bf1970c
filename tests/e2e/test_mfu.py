#!/usr/bin/python3
"""scripts/lib/mfu.py against figures worked out by hand: nanoGPT's GPT-2 124M
(N = 123,689,472 without the position embedding, nanoGPT's "123.69M"; 6N +
12LHQT = 855,383,040 FLOPs a token), the GPU check's Transformer-base (untied:
its lm_head counted, its token embedding not), ResNet-50's 4.09 G
multiply-adds at 224 x 224 (torchvision's "4.09 GFLOPS"; also counted here
with forward hooks on torchvision's model when torchvision is importable),
the peaks by card name (an unknown card: none, and it says so) and the MFU
fraction. N is also checked against the parameters of torch_compare.py's GPT
(tied and untied) when torch is importable.
"""
import sys

import mixtest as mt

sys.path.insert(0, str(mt.SOURCE_DIR / "scripts" / "lib"))
import mfu  # noqa: E402


def near(a, b, rel=1e-12):
    return a is not None and abs(a - b) <= rel * abs(b)


def torch_checks(c):
    try:
        import torch
    except ImportError:
        print("(no torch: the parameter counts of the PyTorch models are not checked)")
        return
    tc = mt.load_script(mt.SOURCE_DIR / "scripts" / "torch_compare.py")
    GPT, _ = tc.build_models(torch)
    for tied in (True, False):
        cfg = dict(mfu.MODELS["gpt2"], layers=2, d_model=48, heads=4, context=20, vocab=96, vocab_real=90, tied=tied)
        model = GPT(cfg)
        n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
        if not tied:
            n -= model.transformer.wte.weight.numel()
        c.check(n == mfu.gpt_params(cfg), f"gpt_params = torch_compare's GPT's parameters less the embeddings "
                f"not in N (tied={tied})", f"{n} against {mfu.gpt_params(cfg)}")
    try:
        import torchvision
    except ImportError:
        print("(no torchvision: ResNet-50's multiply-adds are not counted on its model)")
        return
    macs = []

    def hook(m, _, out):
        if isinstance(m, torch.nn.Conv2d):
            macs.append(out[0].numel() * m.in_channels // m.groups * m.kernel_size[0] * m.kernel_size[1])
        elif isinstance(m, torch.nn.Linear):
            macs.append(m.in_features * m.out_features)
    model = torchvision.models.resnet50()
    for m in model.modules():
        m.register_forward_hook(hook)
    with torch.no_grad():
        model.eval()(torch.zeros(1, 3, 224, 224))
    c.check(sum(macs) == mfu.resnet50_forward_macs(), "ResNet-50 multiply-adds = torchvision's model's, by hooks",
            f"{sum(macs)}")


def main():
    c = mt.Checks("mfu")
    gpt2, base = mfu.MODELS["gpt2"], mfu.MODELS["transformer"]
    # GPT-2 124M: a block is 12 d^2 + 13 d; 12 blocks, ln_f 2d, wte (= lm_head) 50304 x 768.
    n_gpt2 = 12 * (12 * 768 * 768 + 13 * 768) + 2 * 768 + 50304 * 768
    c.check(n_gpt2 == 123_689_472 and mfu.gpt_params(gpt2) == n_gpt2, "GPT-2 124M: N = 123,689,472 (nanoGPT)",
            str(mfu.gpt_params(gpt2)))
    c.check(mfu.gpt_flops_per_token(gpt2) == 6 * 123_689_472 + 12 * 12 * 12 * 64 * 1024 == 855_383_040,
            "GPT-2 124M: 6N + 12LHQT = 855,383,040 FLOPs a token", str(mfu.gpt_flops_per_token(gpt2)))
    n_base = 6 * (12 * 512 * 512 + 13 * 512) + 2 * 512 + 32768 * 512  # lm_head counted, wte and wpe not
    c.check(mfu.gpt_params(base) == n_base == 35_692_544, "Transformer-base (untied): N = 35,692,544",
            str(mfu.gpt_params(base)))
    c.check(mfu.gpt_flops_per_token(base) == 6 * 35_692_544 + 12 * 6 * 8 * 64 * 256 == 223_592_448,
            "Transformer-base: 223,592,448 FLOPs a token", str(mfu.gpt_flops_per_token(base)))
    macs = mfu.resnet50_forward_macs()
    c.check(macs == 4_089_184_256, "ResNet-50 at 224 x 224: 4,089,184,256 multiply-adds (torchvision: 4.09 G)",
            str(macs))
    c.check(mfu.flops_per_unit(mfu.MODELS["resnet50"]) == (6 * 4_089_184_256, "image"),
            "ResNet-50: 3 x 2 x multiply-adds = 24.5 GFLOPs a trained image")
    c.check(mfu.resnet50_forward_macs(32, 10) < macs / 40, "a 32 x 32 image costs about (32/224)^2 of it")
    for name, peak in (("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.4),
                       ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100-PCIE-40GB", 312.0)):
        c.check(mfu.peak_tflops(name)[0] == peak, f"peak of {name}: {peak} TFLOPS", str(mfu.peak_tflops(name)))
    for name in ("Tesla T4", "NVIDIA H100 NVL", ""):
        p, why = mfu.peak_tflops(name)
        c.check(p is None and why, f"no peak for '{name}', with a reason", why)
    c.check(near(mfu.mfu(400_000, 855_383_040, 989.4), 400_000 * 855_383_040 / 989.4e12),
            "MFU of 400k tokens/s of GPT-2 on an H100 SXM = 34.6%", str(mfu.mfu(400_000, 855_383_040, 989.4)))
    c.check(near(mfu.mfu(3000, 24_535_105_536, 989.4), 0.0743939, rel=1e-6),
            "MFU of 3000 images/s of ResNet-50 on an H100 SXM = 7.44%", str(mfu.mfu(3000, 24_535_105_536, 989.4)))
    c.check(all(mfu.mfu(*a) is None for a in ((None, 1, 1), ("n/a", 1, 1), (1, 1, None), (0, 1, 1))),
            "MFU of an unknown rate or peak: None")
    torch_checks(c)
    c.finish()


if __name__ == "__main__":
    main()
