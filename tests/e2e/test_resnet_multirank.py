#!/usr/bin/python3
"""ResNet (models/resnet.cc) end to end through mixtrain:

  1. data parallel: 2 ranks of a narrow resnet-small on synthetic images, AMP with
     FP16 all-reduce, 10 steps with --check-every 1, so every rank's FP32 masters
     and batch_norm running statistics (broadcast from rank 0 after every step)
     are compared after every step; two identical runs write byte-identical
     checkpoints, and the checkpoint's running statistics have moved from their
     initial 0 / 1 and count 10 batches;
  2. --inject-overflow 5:1 (rank 1's gradients become inf at step 5): every rank
     skips step 5 (the per-step check would fail otherwise), the metrics say so,
     and only step 5 is skipped;
  3. interchange with PyTorch: a state_dict of the torch.nn twin of the network
     (tests/python/resnet_reference.py), saved as safetensors, loads with
     --init-from (parameters and buffers), and `--steps 0 --save` writes exactly
     the tensors of that state_dict, with the same names, shapes and values;
  4. ResNet-50's structure at ImageNet size trains a step (synthetic 3x224x224,
     batch 2, --width 8 to stay quick) and reports its peak memory;
  5. the residual adds and the batch norms fused with their relu
     (runtime/passes/fuse_add_relu.h, runtime/passes/fuse_bn_relu.h, the defaults):
     --print-program shows the fused ops, and 4 AMP steps write the same
     checkpoint, byte for byte, as with --no-fuse-add-relu, --no-fuse-bn-relu or
     --no-fuse-param-casts.
"""
import re
import sys

import numpy as np

import mixtest as mt

sys.path.insert(0, str(mt.SOURCE_DIR / "tests" / "python"))
import resnet_reference  # noqa: E402

NET = ["--model", "resnet-small", "--width", 8, "--blocks", "1,1", "--data", "synthetic", "--image-size", 16,
       "--synthetic-size", 256, "--synthetic-classes", 5, "--batch-size", 8, "--eval", "false", "--lr", "0.05"]


def main():
    mt.require_mixtrain()
    c = mt.Checks("resnet_multirank")
    d = mt.workdir("resnet_multirank")

    if mt.have_mpirun() and not mt.os.environ.get("MIX_WITH_MPI") == "OFF":
        # ---- 1: ranks agree after every step; runs are deterministic -----------------------------
        ckpts = []
        for rep in (1, 2):
            ckpt, met = d / f"dp_{rep}.safetensors", d / f"dp_{rep}.jsonl"
            r = mt.mixtrain([*NET, "--steps", 10, "--check-every", 1, "--save", ckpt, "--metrics", met], np=2,
                            timeout=300)
            if c.ok_run(r, f"2 ranks, resnet-small, AMP, 10 steps, --check-every 1, run {rep}"):
                ckpts.append(ckpt)
        if len(ckpts) == 2:
            c.check(ckpts[0].read_bytes() == ckpts[1].read_bytes(), "two identical runs: byte-identical checkpoints")
            t, _ = mt.load_checkpoint(ckpts[0])
            rm, rv = t["bn1.running_mean"], t["layer2.0.bn2.running_var"]
            c.check(np.abs(rm).max() > 0 and np.abs(rv - 1).max() > 0,
                    "the checkpoint's running statistics moved from their initial 0 and 1",
                    f"max |running_mean| {np.abs(rm).max():.3g}, max |running_var - 1| {np.abs(rv - 1).max():.3g}")
            c.check(int(t["layer1.0.bn1.num_batches_tracked"]) == 10, "num_batches_tracked counts the 10 steps",
                    f"{t['layer1.0.bn1.num_batches_tracked']}")

        # ---- 2: an injected overflow on rank 1 is skipped by every rank ----------------------------
        met = d / "overflow.jsonl"
        r = mt.mixtrain([*NET, "--steps", 8, "--check-every", 1, "--inject-overflow", "5:1", "--metrics", met],
                        np=2, timeout=300)
        if c.ok_run(r, "2 ranks, --inject-overflow 5:1, --check-every 1"):
            m = mt.Metrics(met)
            skipped = [s["step"] for s in m.steps if s["skipped"]]
            c.check(skipped == [5], "only step 5 is skipped (every rank: the per-step check passed)", f"{skipped}")
            c.check(m.summary["skipped_steps"] == 1, "the summary counts one skipped step")
    else:
        print("NOTE: no mpirun in this build: the multi-rank parts are not run")

    # ---- 3: torch state_dict in, the same state_dict out ----------------------------------------------
    import torch
    torch.manual_seed(3)
    net = resnet_reference.ResNet([1, 1], 8, False, True, 3, 5)
    with torch.no_grad():  # make the buffers recognisable
        for name, b in net.named_buffers():
            if b.is_floating_point():
                b.copy_(torch.rand_like(b) + 0.5)
            else:
                b.fill_(7)
    sd = {k: v.numpy() for k, v in net.state_dict().items()}
    src, out = d / "torch_state.safetensors", d / "reloaded.safetensors"
    # One tensor the model lacks: left out, and counted as left out.
    mt.safetensors_io.save(src, {**sd, "head.unused": np.zeros(3, dtype=np.float32)})
    r = mt.mixtrain([*NET, "--steps", 0, "--init-from", src, "--save", out], timeout=120)
    if c.ok_run(r, "--init-from a torch.nn ResNet state_dict, --steps 0 --save"):
        c.check(f"loaded {len(sd)} tensors from {src} (1 other tensors ignored)" in r.out,
                "the log counts the tensors loaded and the one ignored", r.out[-600:])
        t, _ = mt.load_checkpoint(out)
        model_tensors = {k: v for k, v in t.items() if not k.startswith("optimizer.")}
        c.check(set(model_tensors) == set(sd), "the saved model tensors are exactly the torch state_dict's keys",
                f"only ours: {sorted(set(model_tensors) - set(sd))[:5]}, only torch's: {sorted(set(sd) - set(model_tensors))[:5]}")
        differing = [k for k in sd if k in t and not (t[k].shape == sd[k].shape and np.array_equal(t[k], sd[k]))]
        c.check(not differing, "every parameter and buffer round-trips bit for bit", f"differing: {differing[:5]}")

    # ---- 4: ResNet-18 and -34 (narrow, 64x64 images) and ResNet-50 at ImageNet size --------------------
    for name in ("resnet18", "resnet34"):
        r = mt.mixtrain(["--model", name, "--width", 8, "--image-size", 64, "--data", "synthetic",
                         "--synthetic-size", 4, "--batch-size", 2, "--steps", 2, "--eval", "false"], timeout=300)
        if c.ok_run(r, f"{name} structure (width 8), synthetic 3x64x64, two AMP steps"):
            c.check(re.search(r"step 2/2 loss [0-9.]+", r.out) is not None, f"{name}: step 2 has a finite loss",
                    r.out[-300:])
    met = d / "r50.jsonl"
    r = mt.mixtrain(["--model", "resnet50", "--width", 8, "--data", "synthetic", "--synthetic-size", 4,
                     "--batch-size", 2, "--steps", 1, "--eval", "false", "--metrics", met], timeout=300)
    if c.ok_run(r, "resnet50 structure (width 8), synthetic 3x224x224, one AMP step"):
        s = mt.Metrics(met).summary
        c.check(s["peak_bytes"] > 0 and s["planned_peak_temporary_bytes"] > 0,
                "the summary reports peak and planned memory", f"peak {s['peak_bytes']} bytes")

    # ---- 5: fused add + relu and batch norm + relu against --no-fuse-add-relu / --no-fuse-bn-relu ------
    # Two blocks: each ends in add + relu, and each block input's gradient is a
    # sum followed by a relu_grad (block 1's input is the stem's relu). The
    # stem's and each block's first batch norm are followed by a relu; the
    # stem relu's gradient is a sum's, so fuse_add_relu (run first) takes it.
    # Each block's last batch norm joins its fused add + relu: 3 + 2 forwards.
    add_relu = r"= (fused_add_relu|fused_sum_relu_grad)\("
    bn_relu = r"= (batch_norm|batch_norm_grad)\(.*fuse_with_relu=true"
    # The weights' FP16 casts: one fused_cast by default (amp::fuse_param_casts), one cast each without.
    weight_casts = r"= (fused_cast|cast)\(X=\[?conv1\.weight"
    for flag, pattern, expected in (
            ([], weight_casts, {"fused_cast": 1, "cast": 0}),
            (["--no-fuse-param-casts"], weight_casts, {"fused_cast": 0, "cast": 1}),
            # By default the blocks' adds went into their last batch norms.
            ([], add_relu, {"fused_add_relu": 0, "fused_sum_relu_grad": 2}),
            (["--no-fuse-bn-relu"], add_relu, {"fused_add_relu": 2, "fused_sum_relu_grad": 2}),
            (["--no-fuse-add-relu"], add_relu, {"fused_add_relu": 0, "fused_sum_relu_grad": 0}),
            ([], bn_relu, {"batch_norm": 5, "batch_norm_grad": 2}),
            # Without fuse_add_relu the stem relu's relu_grad follows a plain sum: 3 gradients.
            (["--no-fuse-add-relu"], bn_relu, {"batch_norm": 3, "batch_norm_grad": 3}),
            (["--no-fuse-bn-relu"], bn_relu, {"batch_norm": 0, "batch_norm_grad": 0})):
        r = mt.mixtrain([*NET, "--print-program", *flag], timeout=60)
        if c.ok_run(r, f"--print-program {' '.join(flag)}"):
            ops = re.findall(pattern, r.out)
            c.check(all(ops.count(op) == n for op, n in expected.items()),
                    f"{' '.join(flag) or 'by default'}: " + ", ".join(f"{n} {op}" for op, n in expected.items()) +
                    (" with fuse_with_relu" if pattern == bn_relu else ""), f"{ops}")
    ckpts = []
    # The weight casts compare with fuse_matmul_bias off on both sides: it fuses
    # the classifier's mul and bias add only once the bias's cast has joined the
    # fused_cast, and its one rounding fewer would tell the runs apart.
    for flag in ([], ["--no-fuse-add-relu"], ["--no-fuse-bn-relu"], ["--no-fuse-matmul-bias"],
                 ["--no-fuse-param-casts", "--no-fuse-matmul-bias"]):
        ckpt = d / f"fuse_{'_'.join(f.strip('-') for f in flag) or 'default'}.safetensors"
        r = mt.mixtrain([*NET, "--steps", 4, "--save", ckpt, *flag], timeout=120)
        if c.ok_run(r, f"4 AMP steps {' '.join(flag) or 'with the fused ops'}"):
            ckpts.append(ckpt)
    if len(ckpts) == 5:
        c.check(ckpts[0].read_bytes() == ckpts[1].read_bytes(),
                "fused and unfused add + relu: byte-identical checkpoints after 4 steps")
        c.check(ckpts[0].read_bytes() == ckpts[2].read_bytes(),
                "fused and unfused batch norm + relu: byte-identical checkpoints after 4 steps")
        c.check(ckpts[3].read_bytes() == ckpts[4].read_bytes(),
                "one fused_cast and one cast per weight: byte-identical checkpoints after 4 steps")
    c.finish()


if __name__ == "__main__":
    sys.exit(main())
