#!/usr/bin/python3
"""--data image-folder end to end: writes a slice of Fashion-MNIST as JPEGs
(6,000 train and 1,000 val 28x28 grayscale images, quality 95, in
train/<class>/ and val/<class>/ folders, with Debian's python3-pil) and trains
resnet-small on them on 2 ranks for 2 epochs, with the ImageNet augmentation
(RandomResizedCrop at --crop-scale 0.5,1 and flips) at --image-size 28.

Asserts: the run succeeds; the test accuracy is >= BAR (74.0% measured on the
CI machine; chance is 10%, and a wrong label mapping or a broken transform
stays near it); the listing was cached beside the data (DIR/.mixtrain-index-*.txt)
and a second run reads the same data from it; the same images as tar shards
give the folder's 12 losses bit for bit (--shard-order global) and train to
the bar streamed per rank (--shard-order stream); the batches are 8-bit pixels
that the model's first op (image_normalize) normalises, under AMP straight
into FP16, and 12 AMP steps give the losses of the program that keeps the
FP16 cast (--no-fold-casts), bit for bit; --skip-bad-images counts the bad
files' reads of both ranks.
"""
import gzip
import os
import subprocess
import sys

import mixtest as mt

BAR = 0.65
TRAIN, VAL = 6000, 1000


def idx(path):
    with gzip.open(path) as f:
        b = f.read()
    nd = b[3]
    dims = [int.from_bytes(b[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    return b[4 + 4 * nd:], dims


def write_jpegs(src, out):
    from PIL import Image

    for split, prefix, n in (("train", "train", TRAIN), ("val", "t10k", VAL)):
        pixels, dims = idx(os.path.join(src, f"{prefix}-images-idx3-ubyte.gz"))
        labels, _ = idx(os.path.join(src, f"{prefix}-labels-idx1-ubyte.gz"))
        side = dims[1] * dims[2]
        for c in range(10):
            (out / split / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(n):
            im = Image.frombytes("L", (dims[2], dims[1]), pixels[i * side:(i + 1) * side])
            im.save(out / split / f"class{labels[i]}" / f"{i:05d}.jpg", quality=95)


def main():
    mt.require_mixtrain()
    mt.require_mpirun()
    src = "/usr/share/datasets/fashion-mnist"
    if not os.path.exists(os.path.join(src, "train-images-idx3-ubyte.gz")):
        mt.skip("needs the Debian package dataset-fashion-mnist")
    try:
        import PIL  # noqa: F401
    except ImportError:
        mt.skip("needs python3-pil (scripts/setup.sh installs it)")
    c = mt.Checks("image_folder")
    d = mt.workdir("image_folder")
    data = d / "fmnist-jpeg"
    write_jpegs(src, data)
    # A folder changed in the last 2 s is not cached (runtime/data/image_folder.cc
    # says why); age the fresh folders rather than sleep.
    for root, _, _ in os.walk(data):
        st = os.stat(root)
        os.utime(root, (st.st_atime - 60, st.st_mtime - 60))
    args = ["--model", "resnet-small", "--data", "image-folder", "--data-dir", data, "--image-size", 28,
            "--crop-scale", "0.5,1", "--mean", "0.286,0.286,0.286", "--std", "0.353,0.353,0.353",
            "--epochs", 2, "--batch-size", 64, "--optimizer", "momentum", "--momentum", "0.9",
            "--weight-decay", "5e-4", "--lr", "0.1", "--lr-schedule", "onecycle", "--data-workers", 1]
    met = d / "run.jsonl"
    r = mt.mixtrain(args + ["--metrics", met], np=2, timeout=600)
    if c.ok_run(r, "resnet-small on JPEG Fashion-MNIST, 2 ranks, 2 epochs"):
        acc = mt.Metrics(met).summary["eval_accuracy"]
        c.check(acc >= BAR, f"test accuracy >= {100 * BAR:.0f}%", f"{100 * acc:.2f}%")
    for split in ("train", "val"):
        c.check((data / f".mixtrain-index-{split}.txt").exists(), f"the {split} listing is cached beside the data")
    # A second, short run reads the listings back (their folders are unchanged).
    r = mt.mixtrain(args + ["--steps", 2, "--eval-batches", 1], np=2, timeout=300)
    c.ok_run(r, "a second run on the cached listing")
    # The same images as tar shards (scripts/make_image_shards.py): the same
    # examples in the same order, so the same losses, bit for bit, step by step.
    shards = d / "fmnist-shards"
    made = subprocess.run([sys.executable, str(mt.SOURCE_DIR / "scripts" / "make_image_shards.py"), str(data),
                           str(shards), "--per-shard", "2000", "--keep-order"], capture_output=True, text=True)
    c.check(made.returncode == 0, "scripts/make_image_shards.py --keep-order writes the shards", made.stderr[-300:])
    short = ["--steps", 12, "--eval-batches", 2]
    folder_met, shard_met = d / "folder12.jsonl", d / "shards12.jsonl"
    shard_args = [a if a != "image-folder" else "image-shards" for a in args]
    shard_args[shard_args.index(data)] = shards
    ra = mt.mixtrain(args + short + ["--metrics", folder_met], np=2, timeout=300)
    # --shard-order global: one permutation over all examples, as the folder's sampler.
    rb = mt.mixtrain(shard_args + short + ["--shard-order", "global", "--metrics", shard_met], np=2, timeout=300)
    if c.ok_run(ra, "12 steps from the folder") and c.ok_run(rb, "12 steps from the shards"):
        la = [mt.Metrics(folder_met).step(n)["loss"] for n in range(1, 13)]
        lb = [mt.Metrics(shard_met).step(n)["loss"] for n in range(1, 13)]
        c.check(la == lb, "shards and folder give the same 12 losses, bit for bit", f"{la[:3]} vs {lb[:3]}")
        ea, eb = mt.Metrics(folder_met).summary, mt.Metrics(shard_met).summary
        c.check(ea.get("val_loss") == eb.get("val_loss"), "and the same validation loss",
                f"{ea.get('val_loss')} vs {eb.get('val_loss')}")
    # The default --shard-order stream: each rank its own shards (3 of 2000
    # examples for 2 ranks), read in order through a shuffle buffer, from
    # shards written shuffled (make_image_shards.py's default); it must train
    # as well as the global order.
    mixed = d / "fmnist-shards-shuffled"
    made = subprocess.run([sys.executable, str(mt.SOURCE_DIR / "scripts" / "make_image_shards.py"), str(data),
                           str(mixed), "--per-shard", "2000"], capture_output=True, text=True)
    c.check(made.returncode == 0, "scripts/make_image_shards.py writes shuffled shards", made.stderr[-300:])
    stream_args = list(shard_args)
    stream_args[stream_args.index(shards)] = mixed
    stream_met = d / "stream.jsonl"
    r = mt.mixtrain(stream_args + ["--shuffle-buffer", 1000, "--metrics", stream_met], np=2, timeout=600)
    if c.ok_run(r, "2 epochs from the shards, --shard-order stream"):
        acc = mt.Metrics(stream_met).summary["eval_accuracy"]
        c.check(acc >= BAR, f"stream order: test accuracy >= {100 * BAR:.0f}%", f"{100 * acc:.2f}%")
    r = mt.mixtrain(shard_args + ["--steps", 1], np=4, timeout=300)
    c.check(r.rc != 0 and "3 training shard(s) for 4 ranks" in r.out and "--shard-order global" in r.out,
            "stream order with fewer shards than ranks: an error saying what to do", r.out[-400:])
    # The readers hand over u8 [N, 28, 28, 3] pixels; the model normalises them
    # (image_normalize), under AMP into the first conv's FP16 input directly.
    amp = ["--precision", "amp"]
    r = mt.mixtrain(args + amp + ["--print-program"], timeout=120)
    first = mt.program_ops(r.out).get(0)
    c.check(first is not None and first.type == "image_normalize" and first.inputs() == {"x"}
            and list(first.outputs().values()) == ["f16"],
            "AMP's program starts with image_normalize of the pixels, writing FP16",
            f"{first.type}({first.ins_text}) -> {first.outs_text}" if first else r.out[-300:])
    folded_met, cast_met = d / "amp_folded.jsonl", d / "amp_cast.jsonl"
    ra = mt.mixtrain(args + amp + short + ["--metrics", folded_met], np=2, timeout=300)
    rb = mt.mixtrain(args + amp + short + ["--no-fold-casts", "--metrics", cast_met], np=2, timeout=300)
    if c.ok_run(ra, "12 AMP steps, image_normalize writing FP16") and c.ok_run(rb, "12 AMP steps, --no-fold-casts"):
        la = [mt.Metrics(folded_met).step(n)["loss"] for n in range(1, 13)]
        lb = [mt.Metrics(cast_met).step(n)["loss"] for n in range(1, 13)]
        c.check(la == lb, "the same 12 losses as FP32 normalisation and a cast, bit for bit", f"{la[:3]} vs {lb[:3]}")
    check_skipped_bad_images(c, d, data)
    c.finish()


def check_skipped_bad_images(c, d, data):
    """--skip-bad-images on 2 ranks: 8 training images, one cut short and one
    empty; one step of 4 a rank reads each exactly once, so the summary counts
    2 replaced reads, summed over the ranks (each rank met one)."""
    import shutil

    bad = d / "with-bad-files"
    shutil.rmtree(bad, ignore_errors=True)
    for split, per_class in (("train", 3), ("val", 1)):
        for cls in ("class0", "class1"):
            (bad / split / cls).mkdir(parents=True)
            for f in sorted((data / split / cls).iterdir())[:per_class]:
                shutil.copy(f, bad / split / cls / f.name)
    good = next((bad / "train" / "class0").iterdir()).read_bytes()
    (bad / "train" / "class0" / "truncated.jpg").write_bytes(good[:len(good) // 2])
    (bad / "train" / "class1" / "empty.jpg").write_bytes(b"")
    met = d / "bad.jsonl"
    args = ["--model", "resnet-small", "--data", "image-folder", "--data-dir", bad, "--image-size", 28,
            "--batch-size", 4, "--steps", 1, "--data-workers", 1]
    r = mt.mixtrain(args + ["--skip-bad-images", "--metrics", met], np=2, timeout=300)
    if c.ok_run(r, "--skip-bad-images with a truncated and an empty JPEG, 2 ranks"):
        replaced = mt.Metrics(met).summary.get("bad_image_reads_replaced")
        c.check(replaced == 2, "the summary counts the 2 replaced reads over both ranks", f"{replaced}")
        c.check("truncated.jpg" in r.out and "empty.jpg" in r.out, "the warnings name both files", r.out[-400:])
    r = mt.mixtrain(args, np=2, timeout=300)
    c.check(r.rc != 0 and ("truncated.jpg" in r.out or "empty.jpg" in r.out),
            "without --skip-bad-images the run fails naming a bad file", r.out[-400:])


if __name__ == "__main__":
    sys.exit(main())
