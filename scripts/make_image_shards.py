#!/usr/bin/python3
"""Writes WebDataset-style tar shards from an image folder, for mixtrain's
--data image-shards: DIR/train/<class>/*.jpg becomes OUT/train-000000.tar, ...
with each image as KEY.jpg (its bytes unchanged) and its class index as
KEY.cls (decimal text). Classes are numbered by the sorted train class folders,
as torchvision's ImageFolder and mixtrain's image-folder reader do.

The training samples are shuffled (seeded) before they are cut into shards:
mixtrain's default --shard-order stream reads each rank's shards front to back
through a buffer of a few thousand samples, and shards holding a class or two
each would give batches of a class or two. With --keep-order the samples keep
the folder's order (class by class, files sorted by name), so that a run with
--shard-order global sees the same examples as one over the folder, bit for
bit. Validation samples always keep the folder's order."""
import io
import random
import sys
import tarfile
from pathlib import Path

USAGE = """usage: scripts/make_image_shards.py DIR OUT [--per-shard N] [--seed N | --keep-order]
WebDataset tar shards of an image folder, for mixtrain --data image-shards --data-dir OUT.
  DIR             an ImageFolder: DIR/train/<class>/*.jpg|*.jpeg|*.png and DIR/val/<class>/... (val optional)
  OUT             where OUT/train-000000.tar, ... and OUT/val-000000.tar, ... go (made if missing)
  --per-shard N   samples a shard (default 10000)
  --seed N        seed of the training samples' shuffle (default 0)
  --keep-order    no shuffle: the folder's order (class by class), for --shard-order global parity runs
Each sample is KEY.EXT (the image's bytes) and KEY.cls (its class index); KEY is CLASS/NAME without
its extension. Exit 2 on a bad argument, a missing train split or an empty class folder."""

PROG = "make_image_shards"
EXTENSIONS = (".jpg", ".jpeg", ".png")


def fail(message):
    print(f"{PROG}: {message}", file=sys.stderr)
    sys.exit(2)


def class_names(split_dir):
    return sorted(p.name for p in split_dir.iterdir() if p.is_dir())


def samples(split_dir, classes):
    """(class index, path) of every image of a split, class by class, files sorted by name."""
    out = []
    for index, name in enumerate(classes):
        folder = split_dir / name
        if not folder.is_dir():
            continue  # a class val lacks: nothing of it to write
        files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in EXTENSIONS)
        if not files:
            fail(f"{folder}: an empty class folder (no .jpg, .jpeg or .png file)")
        out += [(index, f) for f in files]
    return out


def write_split(name, items, out_dir, per_shard):
    shards = 0
    for start in range(0, len(items), per_shard):
        path = out_dir / f"{name}-{shards:06d}.tar"
        with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
            for index, image in items[start:start + per_shard]:
                key = f"{image.parent.name}/{image.stem}"
                for ext, data in ((image.suffix.lower().lstrip("."), image.read_bytes()), ("cls", str(index).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        shards += 1
    print(f"{PROG}: {name}: {len(items)} samples in {shards} shard(s) in {out_dir}")


def main(argv):
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    positional, per_shard, seed, keep_order = [], 10000, 0, False
    i = 0
    while i < len(argv):
        if argv[i] in ("--per-shard", "--seed"):
            if i + 1 >= len(argv) or not argv[i + 1].isdigit() or (argv[i] == "--per-shard" and int(argv[i + 1]) < 1):
                fail(f"{argv[i]} needs a {'positive' if argv[i] == '--per-shard' else 'non-negative'} integer "
                     "(see --help)")
            if argv[i] == "--per-shard":
                per_shard = int(argv[i + 1])
            else:
                seed = int(argv[i + 1])
            i += 2
        elif argv[i] == "--keep-order":
            keep_order = True
            i += 1
        elif argv[i].startswith("-"):
            fail(f"unknown flag {argv[i]} (see --help)")
        else:
            positional.append(argv[i])
            i += 1
    if len(positional) != 2:
        fail("expected DIR and OUT (see --help)")
    src, out = Path(positional[0]), Path(positional[1])
    train = src / "train"
    if not train.is_dir():
        fail(f"{train}: no train split (expected DIR/train/<class>/*.jpg)")
    classes = class_names(train)
    if not classes:
        fail(f"{train}: no class folders")
    out.mkdir(parents=True, exist_ok=True)
    train_samples = samples(train, classes)
    if not keep_order:
        random.Random(seed).shuffle(train_samples)
    write_split("train", train_samples, out, per_shard)
    if (src / "val").is_dir():
        unknown = sorted(set(class_names(src / "val")) - set(classes))
        if unknown:
            fail(f"{src / 'val'}: class folder(s) {', '.join(unknown)} are not in train")
        write_split("val", samples(src / "val", classes), out, per_shard)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
