"""Resume is exact: 10 steps in one run equal 6 steps, --save, then --resume to
step 10, bit for bit (parameters, optimizer state and the scaler's metadata),
for AMP with momentum and for AdamW, on 1 rank and on 2 ranks, with an overflow
before the split, and with every step overflowing (the skip counts); a run killed
after a --save-every checkpoint and resumed from it equals the run that was
never killed; a checkpoint without the scaler's state starts the scaler at its
initial scale; each of the scaler's five fields comes back as saved; the
checkpoint's data position (epoch, batch, also at an epoch's end) and a resumed
run's metrics; --save-every writes every Nth step's checkpoint, the last step's
once; a checkpoint at the last step resumes into no step; the killed run's
metrics lines are on disk; --resume refuses a run that would not continue the saved one
(another seed, shuffle flag, training set size, batch size, rank count or
optimizer) or that also gives --init-from; and a --save path that
cannot be written stops the run before training."""
import os
import re
import signal
import subprocess
import sys

import mixtest

SMALL = ["--data", "synthetic", "--synthetic-size", "1024", "--synthetic-features", "32", "--hidden", "16",
         "--batch-size", "32", "--eval", "false", "--lr", "0.05"]


# The scaler's full state (scale, good, bad, skipped count) and the step.
SCALER_METADATA = ("loss_scale", "scaler_good_steps", "scaler_bad_steps", "scaler_skipped_steps",
                   "scaler_consecutive_skips_at_min", "step")


def differences(expected_path, got_path):
    """What differs between two checkpoints: tensors (by their bytes) and the
    scaler's and step's metadata; also the tensor count and the expected loss scale."""
    a, meta_a = mixtest.load_checkpoint(expected_path)
    b, meta_b = mixtest.load_checkpoint(got_path)
    bad = [k for k in sorted(set(a) | set(b)) if k not in a or k not in b or a[k].tobytes() != b[k].tobytes()]
    bad += [f"metadata {k}" for k in SCALER_METADATA if meta_a.get(k) != meta_b.get(k)]
    return bad, len(a), meta_a.get("loss_scale")


def run_until_killed(args, wanted):
    """Starts one mixtrain and kills it with SIGKILL, as a crash would, as soon as
    a line of its output contains `wanted`. Returns the output up to then and
    whether the kill came before the run ended by itself."""
    mixtest.require_mixtrain()
    env = dict(os.environ)
    env.update(mixtest.THREAD_ENV)
    p = subprocess.Popen([str(mixtest.MIXTRAIN), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, errors="replace", env=env, start_new_session=True)
    seen = []
    killed = False
    try:
        for line in p.stdout:
            seen.append(line)
            if wanted in line:
                os.killpg(p.pid, signal.SIGKILL)
                killed = True
                break
    finally:
        if not killed and p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
    return "".join(seen), killed and p.returncode == -signal.SIGKILL


def check_save_every(checks, tmp):
    """A crash after a --save-every checkpoint loses only the steps after it:
    the run resumed from it ends bit for bit where the uncrashed run does."""
    # Enough steps that the kill, sent the moment step 5's checkpoint is
    # logged, lands long before the end (each save fsyncs a file).
    common = SMALL + ["--precision", "amp", "--optimizer", "momentum", "--incr-every-n-steps", "4", "--steps", "300",
                      "--save-every", "5"]
    full, part, resumed = (os.path.join(tmp, n) for n in ("every_full.st", "every_part.st", "every_resumed.st"))
    out = mixtest.mixtrain(common + ["--save", full]).expect_ok().out
    # Every 5th step but the last, whose checkpoint is written once, after the summary.
    saves = [int(n) for n in re.findall(r"saved checkpoint " + re.escape(full) + r" at step (\d+)", out)]
    checks.check(saves == list(range(5, 301, 5)), "--save-every 5 over 300 steps: one checkpoint every 5 steps, "
                                                  "the last step's once", f"steps {saves[:3]}...{saves[-3:]}")
    killed_metrics = os.path.join(tmp, "every_part.jsonl")
    out, killed = run_until_killed(common + ["--save", part, "--metrics", killed_metrics],
                                   "saved checkpoint " + part + " at step 5")
    if not checks.check(killed, "--save-every 5: the run was killed part-way, after its step-5 checkpoint", out[-2000:]):
        return
    # Each metrics line is flushed as it is written (a step's line comes before its
    # checkpoint): the killed run's first five are on disk, whole.
    steps = [s["step"] for s in mixtest.Metrics(killed_metrics).steps]
    checks.check(steps[:5] == [1, 2, 3, 4, 5], "the killed run's metrics file holds steps 1 to 5",
                 f"steps {steps}")
    _, meta_part = mixtest.load_checkpoint(part)
    step = int(meta_part["step"])
    # Whole: load_checkpoint has read every tensor the header lists.
    checks.check(step % 5 == 0 and 5 <= step < 300, f"the killed run's checkpoint is whole, at step {step}",
                 f"metadata {meta_part}")
    mixtest.mixtrain(common + ["--resume", part, "--save", resumed]).expect_ok()
    bad, tensors, _ = differences(full, resumed)
    checks.check(not bad, f"killed at step {step} and resumed == 300 steps uninterrupted, {tensors} tensors "
                          "bit-identical", f"differing: {bad}")


def check_position(checks, tmp):
    """The checkpoint records where in the data the run stopped, holds no tensor for what
    the schedule or the metadata give (the learning rate, the scaler), and a resumed run's
    metrics count only the steps it trained; a checkpoint at the run's last step resumes
    into no steps at all (it is not past the end)."""
    common = SMALL + ["--precision", "amp"]  # 1024 examples of batch 32: 32 steps an epoch
    at40, again, part, resumed = (os.path.join(tmp, n) for n in ("at40.st", "again.st", "p6.st", "r10.st"))
    mixtest.mixtrain(common + ["--steps", "40", "--save", at40]).expect_ok()
    tensors, meta = mixtest.load_checkpoint(at40)
    checks.check(meta.get("epoch") == "1" and meta.get("batch_in_epoch") == "8",
                 "a checkpoint at step 40 is at epoch 1, batch 8 of it", f"metadata {meta}")
    extra = [k for k in tensors if k == "learning_rate" or k.startswith("loss_scaling")]
    checks.check(not extra, "no tensor for the learning rate or the scaler (they are metadata)", f"{extra}")
    metrics = os.path.join(tmp, "at40_again.jsonl")
    mixtest.mixtrain(common + ["--steps", "40", "--resume", at40, "--save", again, "--metrics", metrics]).expect_ok()
    m = mixtest.Metrics(metrics)
    bad, _, _ = differences(at40, again)
    checks.check(not m.steps and m.summary["steps"] == 0 and not bad,
                 "--resume of a checkpoint at the last step trains no step and saves the same state",
                 f"{len(m.steps)} step lines, summary {m.summary}, differing {bad}")
    mixtest.mixtrain(common + ["--steps", "6", "--save", part]).expect_ok()
    meta = mixtest.load_checkpoint(part)[1]
    checks.check(meta.get("epoch") == "0" and meta.get("batch_in_epoch") == "6",
                 "a checkpoint at step 6 is at epoch 0, batch 6", f"metadata {meta}")
    # The epoch's last step ends it: step 32 of 32 an epoch is epoch 1's start.
    at32 = os.path.join(tmp, "at32.st")
    mixtest.mixtrain(common + ["--steps", "32", "--save", at32]).expect_ok()
    meta = mixtest.load_checkpoint(at32)[1]
    checks.check(meta.get("epoch") == "1" and meta.get("batch_in_epoch") == "0",
                 "a checkpoint at step 32 (an epoch's end) is at epoch 1, batch 0", f"metadata {meta}")
    metrics = os.path.join(tmp, "r10.jsonl")
    mixtest.mixtrain(common + ["--steps", "10", "--resume", part, "--save", resumed, "--metrics", metrics]).expect_ok()
    m = mixtest.Metrics(metrics)
    checks.check([s["step"] for s in m.steps] == [7, 8, 9, 10] and m.summary["steps"] == 4,
                 "resumed at step 6 to 10: metrics lines for steps 7 to 10, and a summary of 4 steps",
                 f"steps {[s['step'] for s in m.steps]}, summary steps {m.summary.get('steps')}")


def check_scaler_round_trip(checks, tmp):
    """Each of the scaler's five fields comes back as saved: a checkpoint resumed at its
    last step (no step trained) saves the same metadata. Its counters must differ from
    one another for this to show a field read or written as another: at the minimum scale
    of 1, an overflow at step 2 is skipped at the minimum, and the good steps 3 and 4 end
    that run of skips (1 skipped, 0 in a row at the minimum, 2 good, 0 bad)."""
    at_min = SMALL + ["--precision", "amp", "--init-loss-scaling", "1", "--min-loss-scaling", "1", "--steps", "4"]
    saved, again = os.path.join(tmp, "round_trip.st"), os.path.join(tmp, "round_trip_again.st")
    mixtest.mixtrain(at_min + ["--inject-overflow", "2", "--save", saved]).expect_ok()
    meta = mixtest.load_checkpoint(saved)[1]
    counters = {k: meta.get(k) for k in SCALER_METADATA}
    checks.check(counters == {"loss_scale": "1", "scaler_good_steps": "2", "scaler_bad_steps": "0",
                              "scaler_skipped_steps": "1", "scaler_consecutive_skips_at_min": "0", "step": "4"},
                 "an overflow at the minimum scale, then 2 good steps: 1 skipped, 0 in a row, 2 good", f"{counters}")
    mixtest.mixtrain(at_min + ["--resume", saved, "--save", again]).expect_ok()
    bad, _, _ = differences(saved, again)
    checks.check(not bad, "resumed at its last step, the checkpoint saves the same scaler state and tensors",
                 f"differing: {bad}; resumed metadata {mixtest.load_checkpoint(again)[1]}")


def check_refusals(checks, tmp):
    """--resume of a run that would not continue the saved one, and --save paths
    that cannot be written, stop before training with exit 2 / 1 and a message
    that names the problem."""
    saved = os.path.join(tmp, "refuse.st")
    base = SMALL + ["--optimizer", "momentum"]
    mixtest.mixtrain(base + ["--steps", "3", "--seed", "7", "--save", saved]).expect_ok()
    for extra, ranks, want in ((["--seed", "8"], 1, "by a run with --seed 7, and this run has --seed 8"),
                               (["--seed", "7", "--batch-size", "16"], 1,
                                "by a run with --batch-size 32, and this run has --batch-size 16"),
                               (["--seed", "7", "--optimizer", "sgd"], 1,
                                "by a run with --optimizer momentum, and this run has --optimizer sgd"),
                               # adamw lacks momentum's tensors: the settings are named before any is missed
                               (["--seed", "7", "--optimizer", "adamw"], 1,
                                "by a run with --optimizer momentum, and this run has --optimizer adamw"),
                               (["--seed", "7", "--shuffle", "false"], 1,
                                "by a run with --shuffle true, and this run has --shuffle false"),
                               (["--seed", "7", "--synthetic-size", "512"], 1,
                                "by a run with a training set of 1024 examples, and this run has a training set "
                                "of 512 examples"),
                               (["--seed", "7"], 2, "by a run with 1 rank(s), and this run has 2 rank(s)")):
        if ranks > 1 and not mixtest.have_mpirun():
            continue
        r = mixtest.mixtrain(base + ["--steps", "6", "--resume", saved] + extra, np=ranks)
        checks.check(r.rc == 2 and want in r.out and "resumed from" not in r.out,
                     f"--resume with {' '.join(extra)} on {ranks} rank(s): exit 2, '{want}'", r.describe())
    r = mixtest.mixtrain(base + ["--steps", "6", "--seed", "7", "--resume", saved])
    checks.check(r.rc == 0, "... and with the saved run's settings it resumes", r.describe())
    # --init-from would load its parameters over the resumed ones, or the resume over them.
    r = mixtest.mixtrain(base + ["--steps", "6", "--seed", "7", "--resume", saved, "--init-from", saved])
    checks.check(r.rc == 2 and "--resume and --init-from are exclusive" in r.out and "resumed from" not in r.out,
                 "--resume with --init-from: exit 2, 'exclusive'", r.describe())
    # A step-0 checkpoint has no data position: any seed may start from it.
    init = os.path.join(tmp, "refuse_init.st")
    mixtest.mixtrain(base + ["--steps", "0", "--seed", "7", "--save", init]).expect_ok()
    r = mixtest.mixtrain(base + ["--steps", "2", "--seed", "8", "--batch-size", "16", "--resume", init])
    checks.check(r.rc == 0, "--resume of a step-0 checkpoint with another seed and batch size runs", r.describe())

    folder = os.path.join(tmp, "a_folder")
    os.makedirs(folder, exist_ok=True)
    for path, want in ((os.path.join(tmp, "no_such_dir", "c.st"), "No such file or directory"),
                       (folder, "it is a folder")):
        r = mixtest.mixtrain(base + ["--steps", "3", "--log-every", "1", "--save", path])
        checks.check(r.rc == 1 and want in r.out and "step 1/" not in r.out,
                     f"--save {os.path.relpath(path, tmp)}: refused before the first step ('{want}')", r.describe())
    r = mixtest.mixtrain(base + ["--steps", "3", "--save-every", "2"])
    checks.check(r.rc == 2 and "--save-every 2 needs --save" in r.out, "--save-every without --save: exit 2",
                 r.describe())


def main():
    checks = mixtest.Checks("resume")
    tmp = mixtest.workdir("resume")
    check_save_every(checks, tmp)
    check_position(checks, tmp)
    check_scaler_round_trip(checks, tmp)
    check_refusals(checks, tmp)
    for ranks in (1, 2):
        for opt in (["--optimizer", "momentum"], ["--optimizer", "adamw", "--lr", "0.002"]):
            # A small incr interval makes the scaler's counters move during the run, and an
            # overflow at step 5, before the split, its bad and skipped counts (the resumed
            # run starts at step 7 and is given none: it refuses a step it never trains).
            common = SMALL + opt + ["--precision", "amp", "--incr-every-n-steps", "4"]
            overflow = ["--inject-overflow", "5"]
            full, part, resumed = (os.path.join(tmp, n) for n in ("full.st", "part.st", "resumed.st"))
            mixtest.mixtrain(common + overflow + ["--steps", "10", "--save", full], np=ranks).expect_ok()
            mixtest.mixtrain(common + overflow + ["--steps", "6", "--save", part], np=ranks).expect_ok()
            mixtest.mixtrain(common + ["--steps", "10", "--resume", part, "--save", resumed], np=ranks).expect_ok()
            bad, tensors, scale = differences(full, resumed)
            checks.check(not bad, f"{ranks} rank(s), {opt[1]}: 10 steps == 6 + resume 4, {tensors} tensors "
                                  f"bit-identical (scale {scale})", f"differing: {bad}")
    # A scale pinned at 1e30 (its minimum) overflows every step: the skipped count, the run of
    # skips at the minimum (10 each, not 5) and the bad count (1 at step 5, so 0 at step 10,
    # not 1) carry across the resume.
    stuck = SMALL + ["--precision", "amp", "--init-loss-scaling", "1e30", "--min-loss-scaling", "1e30"]
    full, part, resumed = (os.path.join(tmp, n) for n in ("stuck_full.st", "stuck_part.st", "stuck_resumed.st"))
    mixtest.mixtrain(stuck + ["--steps", "10", "--save", full]).expect_ok()
    mixtest.mixtrain(stuck + ["--steps", "5", "--save", part]).expect_ok()
    mixtest.mixtrain(stuck + ["--steps", "10", "--resume", part, "--save", resumed]).expect_ok()
    bad, _, _ = differences(full, resumed)
    meta = mixtest.load_checkpoint(resumed)[1]
    checks.check(not bad and meta.get("scaler_skipped_steps") == "10"
                 and meta.get("scaler_consecutive_skips_at_min") == "10" and meta.get("scaler_bad_steps") == "0",
                 "every step overflowing: 10 steps == 5 + resume 5, 10 skipped, 10 in a row at the minimum",
                 f"differing: {bad}; resumed metadata {meta}")
    # A checkpoint without the scaler's state (--steps 0 --save, or FP32 training) starts the
    # scaler afresh, at the initial scale the flags give, not at 1 (as it used to, silently:
    # FP16 gradients then underflow).
    init, fp32 = os.path.join(tmp, "init.st"), os.path.join(tmp, "fp32.st")
    mixtest.mixtrain(SMALL + ["--steps", "0", "--save", init]).expect_ok()
    mixtest.mixtrain(SMALL + ["--precision", "fp32", "--steps", "2", "--save", fp32]).expect_ok()
    for path, extra, want in ((init, [], 32768.0), (init, ["--init-loss-scaling", "1024"], 1024.0),
                              (fp32, [], 32768.0)):
        metrics = os.path.join(tmp, "fresh_scaler.jsonl")
        mixtest.mixtrain(SMALL + ["--precision", "amp", "--steps", "4", "--resume", path, "--metrics", metrics]
                         + extra).expect_ok()
        first = mixtest.Metrics(metrics).steps[0]
        checks.check(first["loss_scale"] == want and not first["skipped"],
                     f"--resume {os.path.basename(path)} {' '.join(extra)}: the scaler starts at {want}",
                     f"first step: {first}")
    # The largest FP32 scale survives the 9 digits the checkpoint writes (3.40282347e+38 is a
    # little above FLT_MAX as a double; the check used to compare it as one).
    flt_max = os.path.join(tmp, "flt_max.st")
    static = SMALL + ["--precision", "amp", "--loss-scaling", "static", "--init-loss-scaling", "3.4028234e38"]
    mixtrain = mixtest.mixtrain(static + ["--steps", "2", "--save", flt_max])
    if checks.ok_run(mixtrain, "static scale FP32's largest: checkpoint"):
        checks.ok_run(mixtest.mixtrain(static + ["--steps", "4", "--resume", flt_max]), "... and resume from it")
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
