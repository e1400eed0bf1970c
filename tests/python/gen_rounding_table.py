#!/usr/bin/python3
"""Writes the float32 -> float16 / bfloat16 rounding table that tests/unit/test_half.cc checks.

Usage: /usr/bin/python3 gen_rounding_table.py OUT.txt

One case per line:  F32BITS F16BITS BF16BITS TAG   (hex, no 0x; TAG names the case kind)
  F16BITS  = numpy: np.float32 -> np.float16 (correctly rounded, ties to even)
  BF16BITS = torch: torch.float32 -> torch.bfloat16 (ties to even)
Lines starting with '#' are comments. For NaN inputs only NaN-ness is meaningful.

The cases sit where rounding is decided: exact halfway points between adjacent
float16 (and bfloat16) values and one float32 ulp either side, the values
themselves, the subnormal range (down to half the smallest subnormal), the
overflow edge around 65504 / 65520, infinities and NaNs, negatives of all of
these, and seeded random normals and subnormals.
"""
import struct
import sys

SETUP_HINT = "needs /usr/bin/python3 with numpy and torch (Debian python3-numpy, python3-torch); run scripts/setup.sh"

try:
    import numpy as np
except ImportError as e:  # the C++ test turns this exit code into a failure naming setup.sh
    sys.stderr.write(f"gen_rounding_table.py: cannot import numpy ({e}); {SETUP_HINT}\n")
    sys.exit(3)
try:
    import torch
except ImportError as e:
    sys.stderr.write(f"gen_rounding_table.py: cannot import torch ({e}); {SETUP_HINT}\n")
    sys.exit(3)


def f32_from_bits(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def f16_values(hbits):
    return np.asarray(hbits, dtype=np.uint16).view(np.float16).astype(np.float32)


def build_cases(rng):
    """Returns (uint32 array of float32 bit patterns, list of tags), positives only."""
    bits, tags = [], []

    def add(values_f32_bits, tag):
        arr = np.asarray(values_f32_bits, dtype=np.uint32).ravel()
        bits.append(arr)
        tags.extend([tag] * arr.size)

    def around(f32bits, tag):
        """The value and one float32 ulp either side (bit neighbours, positive floats)."""
        b = np.asarray(f32bits, dtype=np.uint32).ravel()
        add(b, tag)
        add(b + 1, tag + "+ulp")
        add(b[b > 0] - 1, tag + "-ulp")

    # ---- float16 --------------------------------------------------------------
    # Which half h (low of an adjacent pair h, h+1) to take: every exponent's first
    # and last few mantissas, all of the lowest and highest subnormals, random others.
    mant_pick = np.array([0, 1, 2, 3, 0x1ff, 0x200, 0x201, 0x3fc, 0x3fd, 0x3fe, 0x3ff], dtype=np.uint32)
    h_low = set()
    for e in range(31):
        for m in mant_pick:
            h_low.add((e << 10) | int(m))
    h_low.update(range(0, 40))  # lowest subnormals (0 = +0, so the first pair is 0 .. 2^-24)
    h_low.update(range(0x3f0, 0x400))  # largest subnormals, crossing into the normals
    h_low.update(int(x) for x in rng.integers(0, 0x7bff, size=200))
    h_low = np.array(sorted(h for h in h_low if h <= 0x7bff), dtype=np.uint32)

    lo = f16_values(h_low).astype(np.float64)
    hi = f16_values(h_low + 1).astype(np.float64)
    # Above the max half (0x7bff, 65504) the next step would be 65536: halfway is 65520.
    hi[h_low == 0x7bff] = 65536.0
    mid = ((lo + hi) / 2).astype(np.float32)  # exact: a half midpoint needs 12 significant bits
    assert np.all(mid.astype(np.float64) == (lo + hi) / 2)
    around(mid.view(np.uint32), "f16_tie")
    add(f16_values(h_low[h_low > 0]).view(np.uint32), "f16_exact")

    # Subnormal and zero edges.
    tiny = [
        2.0**-25,  # half the smallest subnormal: tie between 0 and 2^-24, goes to 0
        2.0**-24,  # smallest subnormal
        1.5 * 2.0**-24,  # tie between 1 and 2 subnormal units: goes to 2 (even)
        2.5 * 2.0**-24,  # tie between 2 and 3: goes to 2
        2.0**-26,
        2.0**-14,  # smallest normal
        2.0**-14 - 2.0**-25,  # tie between largest subnormal and smallest normal
        np.finfo(np.float32).tiny,  # smallest normal float32: far below any half
        1e-30,
    ]
    around(np.array(tiny, dtype=np.float32).view(np.uint32), "f16_tiny")
    add([0x00000000, 0x00000001, 0x00000002, 0x007fffff, 0x00400000], "f32_subnormal")

    # Overflow edge.
    edge = np.array([65504.0, 65519.99, 65520.0, 65519.0, 65505.0, 65536.0, 65535.0, 1e5, 1e38], dtype=np.float32)
    around(edge.view(np.uint32), "f16_overflow_edge")
    add([0x7f7fffff, 0x7f800000], "f32_max_inf")

    # NaNs: quiet, signalling, payload only in the bits float16 drops.
    add([0x7fc00000, 0x7f800001, 0x7fa00000, 0x7fbfffff, 0x7fffffff, 0x7f802000, 0x7fc01234], "nan")

    # ---- bfloat16 -------------------------------------------------------------
    # bf16 pattern b covers float32 bits b<<16; halfway to b+1 is (b<<16)|0x8000.
    # Every exponent's first and last mantissa (the last carries into the next exponent;
    # 0x7f7f is the max bf16, whose tie overflows to inf), more mantissas for a sample
    # of exponents, and random patterns.
    b_low = set()
    for e in range(255):
        b_low.update(((e << 7) | 0, (e << 7) | 0x7F))
        if e < 8 or e > 246 or e % 8 == 0:
            b_low.update((e << 7) | m for m in (1, 2, 0x3F, 0x40, 0x41, 0x7D, 0x7E))
    b_low.update(int(x) for x in rng.integers(0, 0x7F7F, size=200))
    b_low = np.array(sorted(b_low), dtype=np.uint32)
    around((b_low << 16) | 0x8000, "bf16_tie")
    add((b_low << 16)[b_low > 0], "bf16_exact")

    # ---- random -----------------------------------------------------------------
    # Log-uniform magnitudes over and a bit beyond the float16 range.
    mags = np.exp2(rng.uniform(-27.0, 17.0, size=600)).astype(np.float32)
    add(mags.view(np.uint32), "random_normal")
    # float16 subnormal range, uniform.
    subs = rng.uniform(0.0, 2.0**-14, size=300).astype(np.float32)
    add(subs.view(np.uint32), "random_f16_subnormal")
    # float32 subnormals (bfloat16 keeps these).
    add(rng.integers(1, 0x00800000, size=100, dtype=np.uint32), "random_f32_subnormal")
    # Uniform bit patterns (all exponents, including inf/NaN now and then).
    add(rng.integers(0, 0x80000000, size=300, dtype=np.uint32), "random_bits")

    return np.concatenate(bits).astype(np.uint32), tags


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: gen_rounding_table.py OUT.txt\n")
        return 2
    rng = np.random.default_rng(20200317)
    pos_bits, pos_tags = build_cases(rng)
    all_bits = np.concatenate([pos_bits, pos_bits | np.uint32(0x80000000)])
    all_tags = pos_tags + ["neg_" + t for t in pos_tags]

    x = f32_from_bits(all_bits)
    with np.errstate(all="ignore"):  # overflow to inf is a case, not an accident
        f16 = x.astype(np.float16).view(np.uint16)
    bf16 = torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)

    # Cross-check numpy's float16 against CPython's own binary16 packing (round to
    # nearest even from the exact double value), so the oracle is not one library's word.
    for xb, hb in zip(all_bits.tolist(), f16.tolist()):
        xf = struct.unpack("<f", struct.pack("<I", xb))[0]
        if xf != xf:
            continue
        try:
            ref = struct.unpack("<H", struct.pack("<e", xf))[0]
        except OverflowError:
            ref = 0xFC00 if xb >> 31 else 0x7C00
        if ref != hb:
            sys.stderr.write(f"numpy float16 and struct 'e' disagree on {xb:08x}: {hb:04x} vs {ref:04x}\n")
            return 4

    with open(sys.argv[1], "w") as out:
        out.write("# f32_bits f16_bits(numpy %s) bf16_bits(torch %s) tag\n" % (np.__version__, torch.__version__))
        for xb, hb, bb, tag in zip(all_bits.tolist(), f16.tolist(), bf16.tolist(), all_tags):
            out.write(f"{xb:08x} {hb:04x} {bb:04x} {tag}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
