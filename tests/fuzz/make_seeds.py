#!/usr/bin/env python3
"""Writes the fuzz targets' seeds: small, valid files of every kind each
reader takes, one folder per target (OUT/<target>/), for the sweep
(fuzz_sweep_<target>) and as libFuzzer's starting corpus (scripts/fuzz.sh).
Each seed is one the reader must accept; the sweep checks that.

usage: make_seeds.py OUT
"""
import io
import json
import os
import struct
import sys
import tarfile

from PIL import Image


def write(out, target, name, data):
    folder = os.path.join(out, target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def safetensors(tensors, metadata=None):
    """tensors: (name, dtype, shape, raw bytes), stored back to back in this order."""
    header, offset, data = {}, 0, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(text)) + text + data


def tar(members, fmt):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, data in members:
            if data is None:
                info = tarfile.TarInfo(name)
                info.type = tarfile.DIRTYPE
                t.addfile(info)
                continue
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def picture(mode, w, h):
    img = Image.new(mode, (w, h))
    px = img.load()
    for y in range(h):
        for x in range(w):
            if mode in ("RGB", "CMYK", "RGBA"):
                v = (x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x * y) % 256, 255, 200)
                px[x, y] = v[: len(mode)]
            elif mode == "LA":
                px[x, y] = ((x * 37 + y * 11) % 256, 128)
            elif mode == "I;16":
                px[x, y] = (x * 4099 + y * 257) % 65536
            else:
                px[x, y] = (x * 37 + y * 11) % 256
    return img


def encoded(img, fmt, **options):
    buf = io.BytesIO()
    img.save(buf, fmt, **options)
    return buf.getvalue()


def token_shard(tokens, version, mode):
    header = struct.pack("<3i", 20240520, version, len(tokens)) + b"\0" * (256 * 4 - 12)
    body = struct.pack("<%d%s" % (len(tokens), "H" if version == 1 else "I"), *tokens)
    return bytes([mode]) + header + body


def main(out):
    # A folder for every target, left empty where the target makes all its
    # seeds itself (own_seeds in its fuzz_<target>.cc), so that each sweep has one to read.
    # Seeds of an earlier version are removed, so that a seed dropped here is not swept.
    here = os.path.dirname(os.path.abspath(__file__))
    for source in sorted(os.listdir(here)):
        if source.startswith("fuzz_") and source.endswith(".cc"):
            folder = os.path.join(out, source[len("fuzz_"):-len(".cc")])
            os.makedirs(folder, exist_ok=True)
            for old in os.listdir(folder):
                os.remove(os.path.join(folder, old))

    # safetensors: several dtypes and shapes, metadata, an empty tensor, no tensor at all.
    f32 = struct.pack("<6f", 1.0, -2.5, 0.0, 3.25, 1e-3, 65504.0)
    write(out, "safetensors", "f32_f16_metadata.safetensors",
          safetensors([("w", "F32", [2, 3], f32), ("b", "F16", [4], struct.pack("<4e", 1, 2, -3, 0.5))],
                      {"step": "12", "loss_scale": "65536"}))
    write(out, "safetensors", "bf16_i64_u8_empty.safetensors",
          safetensors([("e", "F32", [0, 3], b""), ("h", "BF16", [2], b"\x80\x3f\x00\xc0"),
                       ("i", "I64", [1], struct.pack("<q", -7)), ("u", "U8", [3], b"\x01\x02\x03")]))
    write(out, "safetensors", "metadata_only.safetensors", safetensors([], {"format": "pt"}))

    # --data-file: a training split alone, and one with a test split of one-feature examples.
    write(out, "data_file", "train_only.safetensors",
          safetensors([("inputs", "F32", [4, 3], struct.pack("<12f", *[i * 0.5 - 2 for i in range(12)])),
                       ("labels", "I64", [4], struct.pack("<4q", 0, 2, 1, 2))]))
    write(out, "data_file", "train_and_test.safetensors",
          safetensors([("inputs", "F32", [3], struct.pack("<3f", 1, -1, 0.25)),
                       ("labels", "I64", [3], struct.pack("<3q", 1, 0, 1)),
                       ("test_inputs", "F32", [2], struct.pack("<2f", 3, 4)),
                       ("test_labels", "I64", [2], struct.pack("<2q", 0, 2))]))

    # tar shards: the three formats Python writes, long names, a directory, a .png member.
    samples = [("a/img0.jpg", b"\xff\xd8" + b"x" * 40), ("a/img0.cls", b"3"),
               ("a/img1.png", b"\x89PNG" + b"y" * 20), ("a/img1.cls", b"0\n")]
    long_key = "b/" + "long" * 30 + "_img2"
    write(out, "tar_shards", "ustar.tar", tar([("a", None)] + samples, tarfile.USTAR_FORMAT))
    write(out, "tar_shards", "gnu_long_name.tar",
          tar(samples + [(long_key + ".jpg", b"z" * 600), (long_key + ".cls", b"1")], tarfile.GNU_FORMAT))
    write(out, "tar_shards", "pax_long_name.tar",
          tar(samples + [(long_key + ".jpg", b"z" * 10), (long_key + ".cls", b"1")], tarfile.PAX_FORMAT))

    # JPEG: baseline 4:2:0, 4:4:4, progressive, grayscale, sizes that are not whole blocks.
    write(out, "jpeg", "rgb_420.jpg", encoded(picture("RGB", 40, 24), "JPEG", quality=85))
    write(out, "jpeg", "rgb_444_optimized.jpg",
          encoded(picture("RGB", 17, 9), "JPEG", quality=95, subsampling=0, optimize=True))
    write(out, "jpeg", "rgb_progressive.jpg", encoded(picture("RGB", 33, 20), "JPEG", quality=75, progressive=True))
    write(out, "jpeg", "gray.jpg", encoded(picture("L", 23, 31), "JPEG", quality=80))

    # PNG: RGB, gray, palette with transparency, RGBA, 16-bit gray, gray with alpha.
    write(out, "png", "rgb.png", encoded(picture("RGB", 9, 6), "PNG"))
    write(out, "png", "gray.png", encoded(picture("L", 5, 7), "PNG"))
    palette = picture("RGB", 8, 8).convert("P", palette=Image.ADAPTIVE, colors=8)
    write(out, "png", "palette_transparent.png", encoded(palette, "PNG", transparency=0))
    write(out, "png", "rgba.png", encoded(picture("RGBA", 6, 5), "PNG"))
    write(out, "png", "gray16.png", encoded(picture("I;16", 7, 3), "PNG"))
    write(out, "png", "gray_alpha.png", encoded(picture("LA", 4, 4), "PNG"))

    # Token files, mode byte first (fuzz_token_shards.cc): llm.c's shards in
    # uint16 and uint32, nanoGPT's headerless files, a vocabulary of 300.
    tokens = [(i * 7919) % 50257 for i in range(21)]
    small = [(i * 31) % 300 for i in range(17)]
    write(out, "token_shards", "llmc_uint16.bin", token_shard(tokens, 1, 0))
    write(out, "token_shards", "llmc_uint32_flag_vocab300.bin", token_shard(small, 7, 4 | 8))
    write(out, "token_shards", "headerless_uint16.bin", bytes([1]) + struct.pack("<%dH" % len(tokens), *tokens))
    write(out, "token_shards", "headerless_uint32.bin", bytes([5]) + struct.pack("<%dI" % len(small), *small))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
