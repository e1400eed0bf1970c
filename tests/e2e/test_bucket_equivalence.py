#!/usr/bin/python3
"""Bucketing changes how gradients travel, never what they sum to: on 2 ranks in
FP32, 10 steps with --bucket-mb 25 (one bucket), 0.5 (smaller than fc1.weight's
0.8 MB gradient, which then travels alone) and 0.001 (every gradient in its own
bucket) write bit-identical parameters. Bit-exact is the right bar: with two
ranks each element's reduction is the single addition a + b (commutative, so
its order cannot matter), and packing only moves bytes. Under AMP with FP16
all-reduce the same holds (one rounding per element either way).
"""
import sys

import mixtest as mt


def main():
    mt.require_mpirun()
    c = mt.Checks("bucket_equivalence")
    d = mt.workdir("bucket_equivalence")
    base = [*mt.synthetic(size=1024, features=784, classes=10, hidden=(256, 128)), "--eval", "false", "--steps", 10,
            "--batch-size", 16, "--lr", "0.1", "--seed", 4]
    for precision in ("fp32", "amp"):
        ckpts = {}
        for mb in ("25", "0.5", "0.001"):
            ckpt = d / f"{precision}_{mb}.safetensors"
            r = mt.mixtrain([*base, "--precision", precision, "--bucket-mb", mb, "--save", ckpt], np=2, timeout=300)
            if c.ok_run(r, f"{precision}, 2 ranks, --bucket-mb {mb}"):
                ckpts[mb] = mt.parameters_only(mt.load_checkpoint(ckpt)[0])
        if len(ckpts) == 3:
            ref = ckpts["25"]
            for mb in ("0.5", "0.001"):
                diff = [k for k in ref if not mt.bit_identical(ref[k], ckpts[mb][k])]
                c.check(not diff, f"{precision}: --bucket-mb {mb} gives bit-identical parameters to one bucket",
                        f"differing: {diff[:3]}")
    c.finish()


if __name__ == "__main__":
    sys.exit(main())
