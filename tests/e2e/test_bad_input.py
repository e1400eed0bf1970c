#!/usr/bin/python3
"""Bad input stops mixtrain with a non-zero status and a message that names the
problem, and a multi-rank job with a bad rank ends instead of hanging.

docs/design.md: bad flags or values exit 2 naming the flag; the startup fingerprint
(model signature and training config, all-gathered) stops all ranks with a
message naming the differing ranks and fields; a failure on one rank ends the
whole job (main() calls Communicator::abort). Each case is one short run with a
timeout; a case that hangs fails with "timed out" instead of hanging the test.

Cases: unknown flag, --precision fp8, --batch-size 0 (exit 2, and no 300-digit
range in the message), --lr inf and 1e39 (inf in FP32), --momentum nan, range
ends (--momentum, --decr-ratio, --incr-ratio, --dropout, --vocab), a zero
in --hidden, --seed -1, a --loss-scaling-preset with static scaling, --min-loss-scaling above the preset's initial scale, overlapping
AMP lists (names the op), a white list that makes the loss FP16, --grad-reduce fp16 in FP32, malformed
--inject-overflow, AMP lists naming an op mixtrain lacks (and warnings for one the
model's forward program lacks, or any in FP32), flags of another
model, optimizer or data set (each Transformer flag on the MLP, --hidden on a
ResNet, on --model linear and on the Transformer, --momentum with sgd and adamw,
each --synthetic-* flag with Fashion-MNIST, --synthetic-features and
--synthetic-classes on the Transformer; loss-scaler flags
that do nothing only warn), and (exit 2 too,
though only the model or the job can tell) --inject-overflow naming an unknown
parameter, a rank beyond the job or a step the run never trains; missing dataset dir,
dir without the files, truncated .gz, truncated safetensors --data-file, NaN in
--data-file (non-finite, example index), --data-file with another --data;
missing --init-from; ResNet flags (--width, --data-format) on the MLP, an
unknown --data-format, --image-size with a data set, --blocks 2,0, a ResNet on
non-square data or on images too small for it, batch_norm over a single value
per channel; a --data-file label that cannot be a class index (INT64_MAX, 2^62);
a Fashion-MNIST .gz in the user's --data-dir cut short in its gzip trailer or
with one flipped byte (the file and the damage named, no install hint); --seed
2^64, --lr 1e-50 and --grad-predivide 1e30 (refused), --lr 1e-12, a
--grad-predivide above the world size and a training set smaller than a batch
(warnings; the log gives the true batch); damaged checkpoints (a NaN or inf parameter for --init-from and --resume,
NaN in AdamW's state, while inf there, which a healthy run can reach, loads; a non-numeric step ("abc", "6x") and a negative loss scale in the metadata, overlapping
tensor data) and --resume of a checkpoint already past --steps; MPMD jobs whose
ranks differ in --model (both orders), the scaler flags, --bucket-mb,
--synthetic-size, the size of their --data-file, --resume, --benchmark, --save,
--eval or --print-program on one rank only (each a collective the other rank
would wait in forever), and a dead rank (a missing --data-file on rank 1, then
on rank 0); an FP32 run whose loss is inf; an AMP run whose loss scale is stuck at the minimum (the checkpoint
already at --save survives), and one whose static scale overflows every step.
"""
import json
import os
import re
import sys

import numpy as np

import mixtest as mt

FM_DIR = "/usr/share/datasets/fashion-mnist"


def rewrite_header(src, dst, edit):
    """Copies safetensors file `src` to `dst` with edit(header dict) applied to its JSON header."""
    raw = src.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    dst.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])


def main():
    mt.require_mixtrain()
    c = mt.Checks("bad_input")
    d = mt.workdir("bad_input")
    small = [*mt.synthetic(size=256, features=16, classes=4, hidden=(8,)), "--batch-size", 8, "--steps", 3,
             "--eval", "false"]
    lm = ["--model", "transformer", "--layers", 1, "--d-model", 16, "--heads", 2, "--context", 8, "--vocab", 32,
          "--data", "synthetic", "--batch-size", 4, "--steps", 1, "--eval", "false"]

    def expect(args, what, rc=None, names=(), np=1, timeout=30, mpmd=None, absent=()):
        """Runs one case; checks the status (rc; None: any non-zero; "ends": no hang) and that
        each of `names` is in the output."""
        r = mt.mixtrain_mpmd(mpmd, timeout=timeout) if mpmd else mt.mixtrain(args, np=np, timeout=timeout)
        if rc == "ends":  # only "it does not hang": success and failure are both fine
            status_ok, want = not r.timed_out, "the job ends (no hang)"
        else:
            status_ok = not r.timed_out and (r.rc == rc if rc is not None else r.rc not in (0, None))
            want = f"exit {rc}" if rc is not None else "non-zero exit"
        got = "timed out (hang)" if r.timed_out else f"exit {r.rc}"
        c.check(status_ok, f"{what}: {want}", f"{got}, {r.seconds:.1f} s")
        # "rank 1" must come from the message, not from a log prefix or the rank table.
        text = re.sub(r"\[rank \d+/\d+\]|rank \d+ -> ", "", r.out)
        missing = [n for n in names if n not in text]
        c.check(not missing, f"{what}: message names {', '.join(repr(n) for n in names)}",
                f"missing {missing}" if missing else "")
        extra = [why for why, bad in absent if bad(r.out)]
        if absent:
            c.check(not extra, f"{what}: message is readable", "; ".join(extra))
        if not status_ok or missing or extra:
            print(r.describe(1500))
        else:
            lines = [l for l in r.out.splitlines() if "error" in l.lower() or "mixtrain:" in l]
            print(f"     > {(lines or r.out.strip().splitlines() or [''])[0][:220]}")
        return r

    # ---- flags (parsed before MPI starts: exit 2) -------------------------------------------
    expect([*small, "--no-such-flag", "1"], "unknown flag", rc=2, names=["--no-such-flag"])
    expect([*small, "--precision", "fp8"], "--precision fp8", rc=2, names=["--precision", "fp8"])
    # CLI11's PositiveNumber prints "Value 0 not in range 0.000000 to 1797...(300 digits)": it names
    # the flag but reads as if 0 were allowed; a message should not carry a 300-digit number.
    expect([*small, "--batch-size", "0"], "--batch-size 0", rc=2, names=["--batch-size"],
           absent=[("it prints a 300-digit number", lambda out: re.search(r"\d{30}", out))])
    expect([*small, "--amp-white-list", "relu,mean", "--amp-black-list", "mean"], "overlapping AMP lists", rc=2,
           names=["'mean'", "--amp-white-list", "--amp-black-list"])
    expect([*small, "--precision", "fp32", "--grad-reduce", "fp16"], "--grad-reduce fp16 in FP32", rc=2,
           names=["--grad-reduce"])
    expect([*small, "--inject-overflow", "abc"], "--inject-overflow abc", rc=2,
           names=["--inject-overflow", "STEP[:RANK[:PARAM]]"])
    expect([*small, "--inject-overflow", "2:0:nope.weight"], "--inject-overflow of an unknown parameter", rc=2,
           names=["--inject-overflow", "nope.weight"])
    expect([*small, "--inject-overflow", "2:1"], "--inject-overflow on rank 1 of a 1-rank job", rc=2,
           names=["--inject-overflow", "no rank 1"])
    # Both would change nothing and say nothing: a test built on them would pass untested.
    expect([*small, "--inject-overflow", "4"], "--inject-overflow past the run's last step", rc=2,
           names=["--inject-overflow 4", "steps 1 to 3"])
    expect([*small[:-4], "--steps", 0, "--save", d / "never.st", "--inject-overflow", "1"],
           "--inject-overflow with --steps 0", rc=2, names=["--inject-overflow 1", "--steps 0"])
    # Flags of another model, optimizer or data set: silently ignored before.
    # Each of the Transformer's flags, not only --dropout.
    for flag, value in (("--layers", 2), ("--d-model", 32), ("--heads", 2), ("--context", 16), ("--vocab", 300),
                        ("--tie-weights", None), ("--dropout", "0.5")):
        expect([*small, flag, *([] if value is None else [value])], f"{flag} on the MLP", rc=2,
               names=[flag, "--model transformer"])
    expect([*small, "--model", "resnet-small", "--data", "synthetic"], "--hidden on a ResNet", rc=2,
           names=["--hidden", "--model resnet-small"])
    expect([*small, "--model", "linear"], "--hidden on --model linear", rc=2, names=["--hidden", "--model linear"])
    expect([*lm, "--hidden", 8], "--hidden on the Transformer", rc=2, names=["--hidden", "--model transformer"])
    expect([*small, "--optimizer", "sgd", "--momentum", "0.9"], "--momentum with --optimizer sgd", rc=2,
           names=["--momentum", "--optimizer momentum"])
    expect([*small, "--optimizer", "adamw", "--momentum", "0.9"], "--momentum with --optimizer adamw", rc=2,
           names=["--momentum", "--optimizer adamw", "betas"])
    for flag in ("--synthetic-size", "--synthetic-features", "--synthetic-classes"):
        expect(["--hidden", 8, "--steps", 1, flag, 64], f"{flag} with Fashion-MNIST", rc=2,
               names=[flag, "--data synthetic"])
    expect(["--model", "resnet-small", "--data", "synthetic", "--synthetic-features", 99, "--steps", 1],
           "--synthetic-features on a ResNet", rc=2, names=["--synthetic-features", "--image-size"])
    expect([*lm, "--synthetic-features", 8], "--synthetic-features on the Transformer", rc=2,
           names=["--synthetic-features", "tokens (--context)"])
    expect([*lm, "--synthetic-classes", 8], "--synthetic-classes on the Transformer", rc=2,
           names=["--synthetic-classes", "--vocab"])
    expect([*small, "--shard-order", "global"], "--shard-order without image shards", rc=2,
           names=["--shard-order", "--data image-shards"])
    expect(["--model", "resnet-small", "--data", "image-shards", "--data-dir", d, "--shard-order", "global",
            "--shuffle-buffer", 100, "--steps", 1], "--shuffle-buffer with --shard-order global", rc=2,
           names=["--shuffle-buffer", "--shard-order global"])
    # Scaler flags under FP32 only warn: scripts give an AMP and an FP32 run the same flags.
    expect([*small, "--precision", "fp32", "--init-loss-scaling", 8, "--incr-ratio", 3],
               "loss-scaler flags in FP32 training", rc=0,
               names=["--init-loss-scaling, --incr-ratio: FP32 training has no loss scale, so they do nothing"])
    expect([*small, "--loss-scaling", "static", "--init-loss-scaling", 8, "--min-loss-scaling", 2],
           "--min-loss-scaling with a static scale", rc=0,
           names=["--min-loss-scaling: --loss-scaling static has no dynamic scaler, so it does nothing"])
    # --loss-scaling, the preset and --on-min-scale have defaults: warned about when written.
    # The preset under static scaling exits 2 in AMP (below); in FP32 it is one more no-op.
    expect([*small, "--precision", "fp32", "--loss-scaling", "static", "--loss-scaling-preset", "pytorch",
            "--on-min-scale", "continue"], "defaulted loss-scaler flags in FP32 training", rc=0,
           names=["--loss-scaling, --loss-scaling-preset, --on-min-scale: FP32 training has no loss scale"])
    # The AMP lists classify the model's forward ops: a gradient op, or an op the model
    # lacks, moves nothing (a warning: a script may give several models one list).
    expect([*small, "--amp-white-list", "relu_grad", "--amp-black-list", "relu"],
           "an AMP list naming a gradient op", rc=0,
           names=["--amp-white-list relu_grad: the forward program of --model mlp has no such op, so it moves"])
    expect([*small, "--amp-black-list", "softmax,layer_norm"], "AMP lists naming ops the model lacks", rc=0,
           names=["--amp-black-list softmax, --amp-black-list layer_norm", "they move nothing"])
    expect([*small, "--precision", "fp32", "--amp-black-list", "matmul"], "an AMP list in FP32 training", rc=0,
           names=["FP32 training has no AMP lists"])
    # The AMP step keeps the loss FP32; white-listing the op that computes it made it FP16.
    expect([*small, "--amp-white-list", "mean"], "--amp-white-list putting the loss in FP16", rc=2,
           names=["--amp-white-list mean computes the loss 'loss' in f16", "take mean off --amp-white-list"])
    expect([*small, "--amp-white-list", "softmx"], "--amp-white-list naming no op", rc=2,
           names=["--amp-white-list", "'softmx'"])
    expect([*small, "--amp-black-list", "relu,matmull"], "--amp-black-list naming no op", rc=2,
           names=["--amp-black-list", "'matmull'"])
    # CLI11's checks let "inf" through (and, for ranges, "nan"); 1e39 is a double but inf as
    # the FP32 value the learning rate becomes on the device.
    expect([*small, "--lr", "inf"], "--lr inf", rc=2, names=["--lr", "'inf'"])
    expect([*small, "--lr", "1e39"], "--lr 1e39", rc=2, names=["--lr", "FP32"])
    expect([*small, "--momentum", "nan"], "--momentum nan", rc=2, names=["--momentum", "'nan'"])
    # A range's ends belong to it: momentum 1 and decr-ratio 1 are allowed, just past them is not.
    c.ok_run(mt.mixtrain([*small, "--momentum", 1, "--decr-ratio", 1, "--incr-ratio", 1]),
             "--momentum 1 --decr-ratio 1 --incr-ratio 1 (range ends)")
    expect([*small, "--momentum", "1.0001"], "--momentum past its range", rc=2, names=["--momentum", "1.0001"])
    # An --incr-ratio below 1 would shrink the scale after good steps; a --dropout of 1 drops
    # everything (and scales by 1/0); a vocabulary of one token predicts nothing.
    expect([*small, "--incr-ratio", "0.99"], "--incr-ratio below 1", rc=2, names=["--incr-ratio", "0.99"])
    c.ok_run(mt.mixtrain([*lm, "--dropout", "0.99", "--vocab", 2]), "--dropout 0.99 --vocab 2 (range ends)")
    expect([*lm, "--dropout", "1"], "--dropout 1", rc=2, names=["--dropout", "0.99"])
    expect([*lm, "--vocab", "1"], "--vocab 1", rc=2, names=["--vocab"])
    expect([*small, "--hidden", "8,0"], "--hidden 8,0", rc=2, names=["--hidden", "'0'"])
    # CLI11 read "-1" into the unsigned seed as 2^64 - 1, silently, and 2^64 and above too.
    expect([*small, "--seed", "-1"], "--seed -1", rc=2, names=["--seed", "'-1'"])
    expect([*small, "--seed", "18446744073709551616"], "--seed 2^64", rc=2,
           names=["--seed", "'18446744073709551616'", "2^64 - 1"])
    # Values that cannot train: an lr that is 0 in FP32, a pre-division that zeroes every FP16 gradient.
    expect([*small, "--lr", "1e-50"], "--lr 1e-50 (0 in FP32)", rc=2, names=["--lr", "'1e-50'", "FP32"])
    expect([*small, "--grad-predivide", "1e30"], "--grad-predivide 1e30 under an FP16 all-reduce", rc=2,
           names=["--grad-predivide 1e+30", "FP16", "underflow"])
    # Values that may not do what was meant: a warning, and the run goes on.
    expect([*small, "--lr", "1e-12"], "--lr 1e-12 (updates below FP32's resolution)", rc=0,
           names=["--lr 1e-12 is below", "rounded away in FP32"])
    expect([*small, "--grad-predivide", 4], "--grad-predivide above the world size", rc=0,
           names=["--grad-predivide 4 is above the world size 1"])
    # A preset sets the dynamic scaler's defaults: under static scaling it used to be ignored silently.
    expect([*small, "--loss-scaling", "static", "--loss-scaling-preset", "pytorch"], "a preset with static scaling",
           rc=2, names=["--loss-scaling-preset", "--init-loss-scaling"])
    # The paddle preset starts at 32768: a larger minimum used to stop the run in the scaler (exit 1).
    expect([*small, "--min-loss-scaling", "100000"], "--min-loss-scaling above the initial scale", rc=2,
           names=["--min-loss-scaling", "32768", "--init-loss-scaling"])

    # ---- data ---------------------------------------------------------------------------------
    expect(["--data-dir", "/nonexistent", "--steps", 1], "missing dataset dir",
           names=["/nonexistent", "dataset-fashion-mnist"])
    empty = d / "empty"
    empty.mkdir()
    expect(["--data-dir", empty, "--steps", 1], "dataset dir without the files",
           names=[f"{empty}/train-images-idx3-ubyte.gz", "dataset-fashion-mnist"])
    fm = d / "fm_truncated"
    fm.mkdir()
    for f in ("train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        os.symlink(f"{FM_DIR}/{f}", fm / f)
    # A damaged file in the user's own --data-dir: the message says what is wrong with which file,
    # not to install the package (which read as if the data were missing).
    not_install = [("it says to install the package", lambda out: "install" in out)]
    if os.path.exists(f"{FM_DIR}/train-images-idx3-ubyte.gz"):
        with open(f"{FM_DIR}/train-images-idx3-ubyte.gz", "rb") as src:
            (fm / "train-images-idx3-ubyte.gz").write_bytes(src.read(100_000))
        expect(["--data-dir", fm, "--steps", 1], "truncated Fashion-MNIST .gz",
               names=[f"{fm}/train-images-idx3-ubyte.gz", "truncated", "replace the file"], absent=not_install)
        # Cut in the gzip trailer: all the data is there, only the CRC-32 and length are gone.
        # gzread called that end of file, and the file loaded unchecked.
        os.remove(fm / "train-images-idx3-ubyte.gz")
        os.symlink(f"{FM_DIR}/train-images-idx3-ubyte.gz", fm / "train-images-idx3-ubyte.gz")
        os.remove(fm / "t10k-labels-idx1-ubyte.gz")
        labels = open(f"{FM_DIR}/t10k-labels-idx1-ubyte.gz", "rb").read()
        (fm / "t10k-labels-idx1-ubyte.gz").write_bytes(labels[:-4])
        expect(["--data-dir", fm, "--steps", 1], "Fashion-MNIST .gz cut short in its gzip trailer", rc=1,
               names=[f"{fm}/t10k-labels-idx1-ubyte.gz", "truncated", "CRC-32"], absent=not_install)
        flipped = bytearray(labels)
        flipped[len(flipped) // 2] ^= 0x01
        (fm / "t10k-labels-idx1-ubyte.gz").write_bytes(bytes(flipped))
        expect(["--data-dir", fm, "--steps", 1], "Fashion-MNIST .gz with one flipped byte", rc=1,
               names=[f"{fm}/t10k-labels-idx1-ubyte.gz", "corrupt", "replace the file"], absent=not_install)
    else:
        print(f"(no {FM_DIR}: the damaged .gz cases are left out)")

    rng = np.random.default_rng(0)
    good = d / "good.safetensors"
    mt.safetensors_io.save(good, {"inputs": rng.standard_normal((128, 16)).astype(np.float32),
                                  "labels": rng.integers(0, 4, 128).astype(np.int64)})
    trunc = d / "truncated.safetensors"
    trunc.write_bytes(good.read_bytes()[:300])
    data_small = ["--hidden", "8", "--batch-size", 8, "--steps", 3, "--eval", "false"]
    expect([*data_small, "--data-file", trunc], "truncated --data-file", names=[str(trunc), "truncated"])
    x = rng.standard_normal((128, 16)).astype(np.float32)
    x[7, 3] = np.nan
    nan = d / "nan.safetensors"
    mt.safetensors_io.save(nan, {"inputs": x, "labels": rng.integers(0, 4, 128).astype(np.int64)})
    expect([*data_small, "--data-file", nan], "NaN in --data-file inputs", names=[str(nan), "non-finite", "example 7"])
    # The output layer has a row per value up to the largest label: one stray label of 1000
    # among 0..3 makes 1001 classes, which trains without complaint but is worth a warning.
    sparse = d / "sparse_labels.safetensors"
    labels = rng.integers(0, 4, 128).astype(np.int64)
    labels[5] = 1000
    mt.safetensors_io.save(sparse, {"inputs": rng.standard_normal((128, 16)).astype(np.float32), "labels": labels})
    r = mt.mixtrain([*data_small, "--data-file", sparse], timeout=60)
    c.check(r.rc == 0 and "largest label is 1000" in r.out and "1001 output classes" in r.out
            and "only 5 label values" in r.out, "one stray label of 1000 among 0..3: trains, with a warning",
            r.describe(800))
    # A label that cannot be a class index: INT64_MAX made INT64_MAX + 1 classes, which wrapped to a
    # 2-class model that trained; 2^62 failed in std::vector naming neither the file nor the label.
    for big in (2**63 - 1, 2**62):
        huge = d / f"label_{big}.safetensors"
        labels = rng.integers(0, 4, 128).astype(np.int64)
        labels[9] = big
        mt.safetensors_io.save(huge, {"inputs": rng.standard_normal((128, 16)).astype(np.float32), "labels": labels})
        expect([*data_small, "--data-file", huge], f"a label of {big} in --data-file", rc=1,
               names=[str(huge), f"label {big}", "example 9", "renumber"])
    # --data-file used to win silently over the data set --data named.
    expect([*data_small, "--data", "fashion-mnist", "--data-file", good], "--data-file with --data fashion-mnist",
           rc=2, names=["--data-file", "--data fashion-mnist"])

    # Fewer examples a rank than a batch: one short batch a step, as PyTorch's DataLoader gives; a
    # warning names the true batch, and the log counts it (it said "1 ranks x 64").
    tiny = [*mt.synthetic(size=5, features=16, classes=4, hidden=(8,)), "--batch-size", 64, "--steps", 2,
            "--eval", "false"]
    expect(tiny, "5 examples, --batch-size 64", rc=0,
           names=["the training set has 5 examples, 5 a rank", "fewer than --batch-size 64",
                  "one batch of 5 a rank", "steps of 5 examples (1 ranks x 5)"])
    if mt.have_mpirun() and os.environ.get("MIX_WITH_MPI") != "OFF":
        expect(tiny, "5 examples on 2 ranks, --batch-size 64", rc=0, np=2, timeout=60,
               names=["the training set has 5 examples, 3 a rank after the split over 2 rank(s) (padded",
                      "steps of 6 examples (2 ranks x 3)"])

    # ---- ResNets ---------------------------------------------------------------------------------
    expect([*small, "--width", 8], "--width on the MLP", rc=2, names=["--width", "ResNet"])
    expect([*small, "--data-format", "nhwc"], "--data-format on the MLP", rc=2, names=["--data-format", "ResNet"])
    expect(["--model", "resnet-small", "--data-format", "chwn", "--steps", 1], "--data-format chwn", rc=2,
           names=["--data-format", "chwn"])
    expect(["--model", "resnet-small", "--image-size", 32, "--steps", 1], "--image-size with Fashion-MNIST", rc=2,
           names=["--image-size", "synthetic"])
    expect(["--model", "resnet-small", "--blocks", "2,0", "--steps", 1], "--blocks with a zero", rc=2,
           names=["--blocks"])
    nonsquare = d / "nonsquare.safetensors"
    mt.safetensors_io.save(nonsquare, {"inputs": rng.standard_normal((64, 15)).astype(np.float32),
                                       "labels": rng.integers(0, 4, 64).astype(np.int64)})
    expect(["--model", "resnet-small", "--data-file", nonsquare, "--steps", 1], "resnet on non-image data",
           names=["square images", "[15]"])
    r50 = ["--model", "resnet50", "--data", "synthetic", "--synthetic-size", 4, "--width", 4, "--steps", 1,
           "--eval", "false"]
    expect([*r50, "--image-size", 16], "resnet50 on 16x16 images", rc=2, names=["--image-size 16", "at least 32"])
    expect([*r50, "--image-size", 32, "--batch-size", 1], "batch_norm over one value per channel",
           names=["more than one value per channel", "larger batch"])

    # ---- checkpoints ----------------------------------------------------------------------------
    expect([*small, "--init-from", d / "missing.safetensors"], "missing --init-from file",
           names=[str(d / "missing.safetensors")])
    # Damage is refused at load, naming the file and the tensor or field: a NaN parameter used
    # to train on (every AMP step skipped), a bad step to end in a bare "stod", a negative scale
    # to fail in an op, and overlapping tensors to load one tensor's bytes as another's.
    ten = d / "ten_steps.safetensors"
    if c.ok_run(mt.mixtrain([*small[:-4], "--steps", 10, "--eval", "false", "--save", ten]), "checkpoint to damage"):
        tensors, meta = mt.load_checkpoint(ten)
        for value, text in ((np.nan, "nan"), (np.inf, "inf")):
            bad_param = d / f"{text}_param.safetensors"
            w = tensors["fc1.weight"].copy()
            w.flat[5] = value
            mt.safetensors_io.save(bad_param, {**tensors, "fc1.weight": w}, metadata=meta)
            for flag in ("--init-from", "--resume"):
                expect([*small[:-4], "--steps", 12, "--eval", "false", flag, bad_param], f"{text} parameter, {flag}",
                       names=[str(bad_param), "parameter 'fc1.weight'", text, "element 5"])
        # "6x" too: a number with something after it is not one (std::stoll alone reads 6).
        for i, (key, value) in enumerate((("step", "abc"), ("step", "6x"), ("loss_scale", "-5"))):
            bad_meta = d / f"bad_{key}_{i}.safetensors"
            mt.safetensors_io.save(bad_meta, tensors, metadata={**meta, key: value})
            expect([*small[:-4], "--steps", 12, "--eval", "false", "--resume", bad_meta], f"--resume with {key} '{value}'",
                   names=[str(bad_meta), f"'{key}'", f"'{value}'"])
        overlap = d / "overlap.safetensors"

        def bias_over_weight(h):  # starts inside the weight's bytes, not at their start
            begin = h["fc1.weight"]["data_offsets"][0] + 8
            b0, b1 = h["fc1.bias"]["data_offsets"]
            h["fc1.bias"]["data_offsets"] = [begin, begin + b1 - b0]

        rewrite_header(ten, overlap, bias_over_weight)
        expect([*small[:-4], "--steps", 12, "--eval", "false", "--resume", overlap], "overlapping tensor data",
               names=[str(overlap), "overlap", "'fc1.bias'", "'fc1.weight'"])
        # Steps count from the start of training: a checkpoint at step 10 with --steps 4 used to
        # fail inside the batch feeder ("steps [10, 4) run backwards").
        expect([*small[:-4], "--steps", 4, "--eval", "false", "--resume", ten], "--resume past --steps", rc=2,
               names=["--resume", "step 10", "--steps"])
    # Optimizer state must be finite: inf in AdamW's exp_avg_sq would freeze that weight for good
    # (its update is 0 from then on), NaN would make every update NaN.
    adamw = [*small[:-4], "--optimizer", "adamw", "--eval", "false"]
    adamw_ckpt = d / "adamw.safetensors"
    if c.ok_run(mt.mixtrain([*adamw, "--steps", 10, "--save", adamw_ckpt]), "AdamW checkpoint to damage"):
        tensors, meta = mt.load_checkpoint(adamw_ckpt)
        state = next(k for k in tensors if k.startswith("optimizer.exp_avg_sq."))
        for value, text in ((np.inf, "inf"), (np.nan, "nan")):
            path = d / f"exp_avg_sq_{value}.safetensors"
            v = tensors[state].copy()
            v.flat[0] = value
            mt.safetensors_io.save(path, {**tensors, state: v}, metadata=meta)
            expect([*adamw, "--steps", 12, "--resume", path], f"{text} in {state}", names=[str(path), f"'{state}'", text])

    # ---- training that cannot go on ---------------------------------------------------------------
    # FP32 has no scaler to skip a step: a non-finite loss stops the run, inf as well as NaN (logits
    # 3e38 and -3e38 give a loss of inf with finite gradients, softmax minus one-hot, which would
    # train on silently).
    inf_init = d / "inf_logits.safetensors"
    mt.safetensors_io.save(inf_init, {"fc1.weight": np.zeros((4, 16), np.float32),
                                      "fc1.bias": np.array([3e38, -3e38, -3e38, -3e38], np.float32)})
    expect(["--model", "linear", "--data-file", good, "--precision", "fp32", "--batch-size", 8, "--steps", 3,
            "--eval", "false", "--init-from", inf_init], "FP32 loss of inf", rc=1,
           names=["step 1: the loss is inf in FP32 training", "lower --lr"])
    # A loss scale pinned at 1e30 overflows every FP16 gradient: after 100 skipped steps at the
    # minimum the run stops with the scaler's advice, and the checkpoint already at --save survives.
    saved = d / "saved.safetensors"
    saved.write_bytes(good.read_bytes())
    expect([*small[:-4], "--steps", 150, "--eval", "false", "--precision", "amp", "--init-loss-scaling", "1e30",
            "--min-loss-scaling", "1e30", "--save", saved], "loss scale stuck at the minimum",
           names=["stuck at the minimum", "100 consecutive steps", "--on-min-scale continue"])
    c.check(saved.read_bytes() == good.read_bytes(), "loss scale stuck at the minimum: --save file left as it was")
    # The writability probe before step 1 removes the FILE.tmp it made.
    c.check(not saved.with_name(saved.name + ".tmp").exists(), "loss scale stuck at the minimum: no FILE.tmp left")
    # A static scale cannot go lower: it used to skip forever, never "at the minimum" of 1.
    expect([*small[:-4], "--steps", 150, "--eval", "false", "--precision", "amp", "--loss-scaling", "static",
            "--init-loss-scaling", "1e30"], "static loss scale that overflows every step", rc=1,
           names=["loss scale is stuck", "100 consecutive steps", "static loss scale 1e+30", "cannot go lower",
                  "lower --init-loss-scaling"])

    # ---- ranks that disagree, ranks that die --------------------------------------------------
    if not mt.have_mpirun():
        print(f"(no mpirun {mt.MPIRUN!r}: the multi-rank cases are left out)")
        c.finish()
    # The fingerprint must be compared before the initial parameters are broadcast: a
    # broadcast between different models fails in MPI (or worse) instead of naming the field.
    i = small.index("--hidden")
    model_flags = {"mlp": small, "linear": small[:i] + small[i + 2:]}  # --hidden is refused without hidden layers
    for m0, m1 in (("mlp", "linear"), ("linear", "mlp")):
        expect(None, f"rank 0 runs --model {m0}, rank 1 --model {m1}", timeout=60,
               mpmd=[(1, [*model_flags[m0], "--model", m0]), (1, [*model_flags[m1], "--model", m1])],
               names=["startup fingerprint", "rank 1 differs", "model"])
    # --device is compared before anything else: GPU binding and NCCL start-up are
    # collectives that only the cuda ranks would call (a mismatch used to end in
    # whichever error a lone rank met first, or an MPI truncation).
    expect(None, "rank 0 runs --device cpu, rank 1 --device cuda", timeout=60,
           mpmd=[(1, [*small, "--device", "cpu"]), (1, [*small, "--device", "cuda"])],
           names=["startup fingerprint", "rank 1 differs", "device"])
    # Flags that change what a rank computes or how it talks must be in the fingerprint too.
    # Without them the scaler flags differed unnoticed (the run succeeded; the scales would
    # diverge on the first growth or overflow) and different buckets corrupted the heap in
    # MPI_Allreduce ("free(): invalid next size", exit 134).
    differing = {"--incr-ratio": ("2", "3"), "--decr-ratio": ("0.8", "0.5"), "--min-loss-scaling": ("1", "2"),
                 "--on-min-scale": ("error", "continue")}
    a0 = [x for k, (v, _) in differing.items() for x in (k, v)]
    a1 = [x for k, (_, v) in differing.items() for x in (k, v)]
    expect(None, "rank 1 differs in the loss-scaler flags", timeout=60,
           mpmd=[(1, [*small, *a0]), (1, [*small, *a1])],
           names=["startup fingerprint", "rank 1 differs", *[k[2:] for k in differing]])
    big = [*mt.synthetic(size=64, features=784, classes=10, hidden=(256, 128)), "--batch-size", 8, "--steps", 2,
           "--eval", "false"]
    expect(None, "rank 1 has another --bucket-mb (one 0.5 MB bucket vs several 0.1 MB ones)", timeout=60,
           mpmd=[(1, [*big, "--bucket-mb", 25]), (1, [*big, "--bucket-mb", 0.1])],
           names=["startup fingerprint", "rank 1 differs", "bucket-mb"])
    # A different data set size means a different number of steps per epoch: unless the
    # fingerprint notices, one rank finishes while the other waits in an all-reduce forever.
    epoch = ["--data", "synthetic", "--synthetic-features", 16, "--synthetic-classes", 4, "--hidden", 8,
             "--batch-size", 8, "--epochs", 1, "--eval", "false"]
    expect(None, "rank 1 has another --synthetic-size (steps per epoch differ)", timeout=15,
           mpmd=[(1, [*epoch, "--synthetic-size", 256]), (1, [*epoch, "--synthetic-size", 512])],
           names=["rank 1 differs", "synthetic-size"])
    # The same for data files of different sizes (each rank names its own file): --data-file
    # may legitimately differ in path, but DistributedSampler needs one data set on all ranks.
    other_size = d / "other_size.safetensors"
    mt.safetensors_io.save(other_size, {"inputs": rng.standard_normal((256, 16)).astype(np.float32),
                                        "labels": rng.integers(0, 4, 256).astype(np.int64)})
    by_epoch = ["--hidden", "8", "--batch-size", 8, "--epochs", 1, "--eval", "false"]
    expect(None, "rank 1's --data-file has 256 examples, rank 0's 128 (--epochs 1)", timeout=15,
           mpmd=[(1, [*by_epoch, "--data-file", good]), (1, [*by_epoch, "--data-file", other_size])],
           names=["rank 1"])
    # Flags given to one rank only that change which collectives it calls (a different start
    # step, timed steps, the barrier after --save, evaluation's reductions, a printout instead of
    # training): the fingerprint names them. --save, --eval and --print-program used to hang.
    resume_from = d / "two_steps.safetensors"
    few = [*mt.synthetic(size=256, features=16, classes=4, hidden=(8,)), "--batch-size", 8, "--eval", "false"]
    if c.ok_run(mt.mixtrain([*few, "--steps", 2, "--save", resume_from]), "checkpoint to resume from"):
        expect(None, "only rank 1 resumes (--resume)", timeout=15,
               mpmd=[(1, [*few, "--steps", 4]), (1, [*few, "--steps", 4, "--resume", resume_from])],
               names=["rank 1 differs", "resume"])
    one_rank_only = {"--benchmark": ["--benchmark", "--benchmark-warmup", 2],
                     "--save": ["--save", d / "rank0_only.safetensors"],
                     "--eval": ["--eval", "true"],
                     "--print-program": ["--print-program"]}
    for flag, extra in one_rank_only.items():
        expect(None, f"only rank 0 runs {flag}", timeout=15,
               mpmd=[(1, [*few, "--steps", 4, *extra]), (1, [*few, "--steps", 4])],
               names=["rank 1 differs", flag[2:]])
    missing = d / "missing_data.safetensors"
    expect(None, "rank 1's --data-file does not exist (a dead rank)", timeout=60,
           mpmd=[(1, [*data_small, "--data-file", good]), (1, [*data_small, "--data-file", missing])],
           names=[str(missing)])
    expect(None, "rank 0's --data-file does not exist (a dead rank)", timeout=60,
           mpmd=[(1, [*data_small, "--data-file", missing]), (1, [*data_small, "--data-file", good])],
           names=[str(missing)])
    c.finish()


if __name__ == "__main__":
    sys.exit(main())
