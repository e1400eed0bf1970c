#!/usr/bin/python3
"""Token shards for `mixtrain --data token-shards` from plain text, with a
byte-level tokenizer (each byte one token, vocabulary 256), in llm.c's shard
layout: a header of 256 little-endian int32 (magic 20240520, version 1 for
uint16 tokens or 7 for uint32, the token count), then the tokens. With
--headerless, nanoGPT's train.bin and val.bin instead (the tokens alone).

    /usr/bin/python3 scripts/make_token_shards.py OUT_DIR INPUT [INPUT ...]

Splits (--split):
  tail      the last --val-fraction of each input file's bytes go to the
            validation split, so both splits sample every file;
  fortunes  exactly the byte streams of `mixtrain --data fortunes`
            (runtime/data/text.cc, load_byte_text): each file cut into entries
            at lines holding a single '%', every 20th entry (counted across
            files) to the validation split. With one shard per split (the
            default --shard-tokens holds the fortunes many times over) the
            shards give the very same windows, so the two data sets train alike.

A directory INPUT stands for its regular files, sorted by name, with the
symbolic links, fortune's *.dat indexes and *.u8 links skipped, as
load_byte_text reads them.
"""
import argparse
import os
import struct
import sys
from array import array
from pathlib import Path

MAGIC = 20240520
HEADER_INTS = 256
VERSIONS = {1: "H", 7: "I"}  # llm.c's versions: the array typecode of their token width
VALIDATION_EVERY = 20  # load_byte_text's every 20th entry
MAX_SHARD_TOKENS = 2**31 - 1  # the header's token count is an int32

USAGE_TAIL = """Writes OUT_DIR/PREFIX_train_NNNNNN.bin and OUT_DIR/PREFIX_val_NNNNNN.bin (or, with --headerless,
OUT_DIR/train.bin and OUT_DIR/val.bin) and prints what it wrote. Windows of mixtrain's --context + 1 tokens
never cross a shard's end, so a split cut into several shards loses under --context tokens per shard.
Exit 2 on a bad option, a missing input or a split with no bytes."""


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="scripts/make_token_shards.py",
        description="Byte-level token shards (llm.c's format, or nanoGPT's headerless files) from text files, "
        "for mixtrain --data token-shards --data-dir OUT_DIR.",
        epilog=USAGE_TAIL, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", metavar="OUT_DIR", help="where the shards go (created if missing)")
    p.add_argument("inputs", metavar="INPUT", nargs="+", help="text files, or directories of them")
    p.add_argument("--split", choices=("tail", "fortunes"), default="tail",
                   help="how bytes go to the validation split (default: tail)")
    p.add_argument("--val-fraction", type=float, default=None,
                   help="--split tail: the share of each file's bytes, at its end, for validation (default 0.05)")
    p.add_argument("--shard-tokens", type=int, default=None,
                   help="tokens per shard, at most 2^31 - 1 (default 100000000, llm.c's)")
    p.add_argument("--version", type=int, choices=sorted(VERSIONS), default=1,
                   help="llm.c header version: 1 (uint16 tokens) or 7 (uint32 tokens) (default 1)")
    p.add_argument("--prefix", default="bytes", help="shard names start with this (default: bytes)")
    p.add_argument("--headerless", action="store_true",
                   help="write nanoGPT's train.bin and val.bin (no header, one file per split; uint16 tokens, or "
                   "uint32 with --version 7: read them with --token-dtype uint32)")
    a = p.parse_args(argv)
    if a.split == "fortunes" and a.val_fraction is not None:
        p.error("--val-fraction is for --split tail; --split fortunes holds out every 20th entry")
    if a.val_fraction is None:
        a.val_fraction = 0.05
    if not 0 < a.val_fraction < 1:
        p.error(f"--val-fraction must be between 0 and 1, got {a.val_fraction}")
    if a.headerless and a.shard_tokens is not None:
        p.error("--shard-tokens cuts llm.c shards; --headerless writes one file per split")
    if a.shard_tokens is None:
        a.shard_tokens = 100_000_000
    if not 1 <= a.shard_tokens <= MAX_SHARD_TOKENS:
        p.error(f"--shard-tokens must be from 1 to {MAX_SHARD_TOKENS}, got {a.shard_tokens}")
    if "/" in a.prefix or not a.prefix:
        p.error(f"--prefix must be a plain file-name part, got {a.prefix!r}")
    return a, p


def input_files(inputs, parser):
    """The files the inputs name, a directory's in load_byte_text's order and selection."""
    files = []
    for given in inputs:
        path = Path(given)
        if path.is_dir():
            names = sorted(os.listdir(path), key=os.fsencode)  # byte order, as std::filesystem::path compares
            for n in names:
                f = path / n
                if f.is_symlink() or not f.is_file() or f.suffix in (".dat", ".u8"):
                    continue
                files.append(f)
        elif path.is_file():
            files.append(path)
        else:
            parser.error(f"{given}: no such file or directory")
    return files


def entries(data):
    """A fortune file's entries: cut after each line holding a single '%', each
    line with its '\\n' (a last line without one gets one), as entries_of in text.cc."""
    if not data:
        return []
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    out, current = [], bytearray()
    for line in lines:
        current += line + b"\n"
        if line == b"%":
            out.append(bytes(current))
            current = bytearray()
    if current:
        out.append(bytes(current))
    return out


def streams(files, split, val_fraction):
    train, val = bytearray(), bytearray()
    entry = 0
    for f in files:
        data = f.read_bytes()
        if split == "fortunes":
            for e in entries(data):
                entry += 1
                (val if entry % VALIDATION_EVERY == 0 else train).extend(e)
        else:
            cut = len(data) - int(len(data) * val_fraction)
            train += data[:cut]
            val += data[cut:]
    return bytes(train), bytes(val)


def tokens_bytes(data, typecode):
    """The bytes of `data` as little-endian tokens, one per byte."""
    width = 2 if typecode == "H" else 4
    code = next(c for c in (typecode, "L") if array(c).itemsize == width)
    a = array(code, iter(data))  # an iterator: bytes themselves would be read as raw items
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


def write_split(out_dir, args, name, data):
    typecode = VERSIONS[args.version]
    written = []
    if args.headerless:
        path = out_dir / f"{name}.bin"
        path.write_bytes(tokens_bytes(data, typecode))
        return [(path, len(data))]
    for i, start in enumerate(range(0, len(data), args.shard_tokens)):
        chunk = data[start:start + args.shard_tokens]
        header = struct.pack(f"<{HEADER_INTS}i", MAGIC, args.version, len(chunk), *([0] * (HEADER_INTS - 3)))
        path = out_dir / f"{args.prefix}_{name}_{i:06d}.bin"
        with open(path, "wb") as f:
            f.write(header)
            f.write(tokens_bytes(chunk, typecode))
        written.append((path, len(chunk)))
    return written


def main(argv):
    args, parser = parse_args(argv)
    files = input_files(args.inputs, parser)
    if not files:
        parser.error("the inputs hold no text files")
    train, val = streams(files, args.split, args.val_fraction)
    for name, data in (("train", train), ("val", val)):
        if not data:
            print(f"make_token_shards: the {name} split has no bytes (inputs too small?)", file=sys.stderr)
            return 2
    out_dir = Path(args.out_dir)
    # Old shards beside new ones would be read as part of the data set; replacing them is left to the user.
    old = [p.name for p in sorted(out_dir.glob("*.bin"))
           if "_train_" in p.name or "_val_" in p.name or p.name in ("train.bin", "val.bin")] if out_dir.is_dir() else []
    if old:
        print(f"make_token_shards: {out_dir} already holds token files ({', '.join(old[:3])}"
              f"{', ...' if len(old) > 3 else ''}), which mixtrain would read with the new ones: remove them or "
              "choose another OUT_DIR", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in (("train", train), ("val", val)):
        for path, count in write_split(out_dir, args, name, data):
            print(f"{path}: {count} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
