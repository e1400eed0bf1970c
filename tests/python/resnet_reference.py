#!/usr/bin/python3
"""Reference values of one ResNet training step, computed by PyTorch, for tests/unit/test_resnet_parity.cc.

    /usr/bin/python3 tests/python/resnet_reference.py OUT.safetensors [--blocks 2,2,2,2] [--width 4]
        [--bottleneck] [--small-input | --image 32] [--channels 3] [--image 16] [--classes 10] [--batch 4] [--seed 0]

Builds, from torch.nn modules, the network torchvision's resnet.py builds (BasicBlock or
Bottleneck with the stride on the 3x3 conv, downsample = 1x1 conv + BatchNorm2d, global
average pool, fc), with torchvision's module names so that the state_dict names are
mixtrain's (models/resnet.cc). --small-input swaps the 7x7 stride-2 stem and its max-pool
for a 3x3 stride-1 stem (mixtrain's resnet-small). Initialisation as torchvision's:
kaiming_normal_(fan_out, relu) convs, BN weight 1 and bias 0, default Linear. Writes (via
tests/python/safetensors_io.py):

    init.<name>           the initial state_dict, buffers included (running_mean, running_var,
                          num_batches_tracked)
    x, label              f32 [B, C, S, S] ~ N(0, 1), i64 [B, 1]
    loss, grad.<param>    training-mode loss (batch statistics) and gradients at init
    loss64, grad64.<param>  the same in float64 from the same float32 values, rounded to float32
    after.<buffer>        every buffer after that training-mode forward (running statistics
                          updated with momentum 0.1 and the unbiased variance; the counter at 1)
    eval_logits           logits of model.eval() on x with those updated buffers
    gradp.<param>         gradients with every parameter perturbed by one FP16 rounding's worth,
                          (1 + 2^-11 N(0, 1)): how much the network itself amplifies such changes

Deterministic: seeded, torch.set_num_threads(2), torch.use_deterministic_algorithms(True).
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


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, width, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.downsample = None
        if stride != 1 or cin != width:
            self.downsample = nn.Sequential(nn.Conv2d(cin, width, 1, stride, bias=False), nn.BatchNorm2d(width))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (x if self.downsample is None else self.downsample(x)))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride):
        super().__init__()
        out = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or cin != out:
            self.downsample = nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        return F.relu(h + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    def __init__(self, blocks, width, bottleneck, small_input, channels, classes):
        super().__init__()
        block = Bottleneck if bottleneck else BasicBlock
        self.small_input = small_input
        if small_input:
            self.conv1 = nn.Conv2d(channels, width, 3, 1, 1, bias=False)
        else:
            self.conv1 = nn.Conv2d(channels, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        cin = width
        for s, n in enumerate(blocks):
            layers = []
            for i in range(n):
                layers.append(block(cin, width << s, 2 if (i == 0 and s > 0) else 1))
                cin = (width << s) * block.expansion
            setattr(self, f"layer{s + 1}", nn.Sequential(*layers))
        self.stages = len(blocks)
        self.fc = nn.Linear(cin, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        if not self.small_input:
            x = F.max_pool2d(x, 3, 2, 1)
        for s in range(self.stages):
            x = getattr(self, f"layer{s + 1}")(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--blocks", default="2,2,2,2")
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--bottleneck", action="store_true")
    ap.add_argument("--small-input", action="store_true")
    ap.add_argument("--channels", type=int, default=3)
    ap.add_argument("--image", type=int, default=16)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    blocks = [int(b) for b in a.blocks.split(",")]

    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(a.seed)
    args = (blocks, a.width, a.bottleneck, a.small_input, a.channels, a.classes)
    model = ResNet(*args).float().train()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x = torch.randn(a.batch, a.channels, a.image, a.image)
    label = torch.randint(0, a.classes, (a.batch,))

    out = {f"init.{k}": v.numpy().copy() for k, v in init.items()}
    out["x"] = x.numpy()
    out["label"] = label.reshape(a.batch, 1).numpy()
    loss = F.cross_entropy(model(x), label)
    loss.backward()
    out["loss"] = np.array([loss.item()], np.float32)
    for k, p in model.named_parameters():
        out[f"grad.{k}"] = p.grad.numpy().copy()
    for k, b in model.named_buffers():
        out[f"after.{k}"] = b.detach().numpy().copy()
    model.eval()
    with torch.no_grad():
        out["eval_logits"] = model(x).numpy().copy()

    m64 = ResNet(*args).double().train()
    m64.load_state_dict({k: (v.double() if v.is_floating_point() else v) for k, v in init.items()})
    loss64 = F.cross_entropy(m64(x.double()), label)
    loss64.backward()
    out["loss64"] = np.array([loss64.item()], np.float32)
    for k, p in m64.named_parameters():
        out[f"grad64.{k}"] = p.grad.numpy().astype(np.float32)

    # The network's own sensitivity to FP16-sized changes: gradients with every parameter
    # multiplied by (1 + 2^-11 N(0, 1)), one FP16 rounding's worth. Deep BN nets at
    # initialisation amplify such changes in their early layers; the AMP test measures
    # its deviation from FP32 against this.
    pert = ResNet(*args).float().train()
    pert.load_state_dict(init)
    with torch.no_grad():
        for p in pert.parameters():
            p.mul_(1 + 2.0 ** -11 * torch.randn_like(p))
    F.cross_entropy(pert(x), label).backward()
    for k, p in pert.named_parameters():
        out[f"gradp.{k}"] = p.grad.numpy().copy()

    meta = {"blocks": a.blocks, "width": str(a.width), "bottleneck": str(int(a.bottleneck)),
            "small_input": str(int(a.small_input)), "channels": str(a.channels), "image": str(a.image),
            "classes": str(a.classes), "batch": str(a.batch), "torch": torch.__version__}
    safetensors_io.save(a.out, out, metadata=meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
