"""Preemption: a stop signal (SIGTERM, SIGINT, SIGUSR1; --stop-signals) stops
training at the next step on every rank, rank 0 saves one checkpoint with its
completion marker, mixtrain exits 75, and `--resume auto` continues from it to
the same parameters, bit for bit, as a run never stopped.

Checked on 2 ranks under mixrun: SIGUSR1 to mpirun (it passes it on at once),
SIGTERM to one rank only (the others learn it through the step's loss
all-reduce), SIGTERM to mpirun (passed on after mixrun's --stop-grace); and on
one rank: --keep-checkpoints' history, --resume auto's fresh start and its
passing over a checkpoint cut short, and --stop-signals none."""
import os
import re
import signal
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
import mixtest  # noqa: E402
from jobs import rank_pids, run_and_signal  # noqa: E402

MIXRUN = mixtest.BUILD_DIR / "mixrun"
STEPS = 6000
TRAIN = ["--data", "synthetic", "--synthetic-size", "1024", "--synthetic-features", "32", "--hidden", "16",
         "--batch-size", "32", "--eval", "false", "--lr", "0.05", "--optimizer", "momentum", "--steps", str(STEPS),
         "--log-every", "200", "--check-every", "0"]


def stopped_step(out):
    m = re.search(r"stopped by (.*?) at step (\d+) of", out)
    return (m.group(1), int(m.group(2))) if m else (None, None)


def same_parameters(checks, reference, got, what):
    a, _ = mixtest.load_checkpoint(reference)
    b, meta = mixtest.load_checkpoint(got)
    bad = [k for k in sorted(set(a) | set(b)) if k not in a or k not in b or not mixtest.bit_identical(a[k], b[k])]
    checks.check(not bad and meta.get("step") == str(STEPS), what, f"differ: {bad[:3]}, step {meta.get('step')}")


def marker_step(path):
    import json

    try:
        return json.loads(Path(str(path) + ".complete").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return None


def main():
    mixtest.require_mixtrain()
    mixtest.require_mpirun()
    checks = mixtest.Checks("preemption")
    tmp = mixtest.workdir("preemption")
    mixrun = [MIXRUN, "-n", "2", "--oversubscribe", "--mpirun", mixtest.MPIRUN]

    # The run never stopped, on 2 ranks and on 1.
    ref2, ref1 = tmp / "ref2.safetensors", tmp / "ref1.safetensors"
    r = mixtest.launch([*mixrun, "--", mixtest.MIXTRAIN, *TRAIN, "--save", ref2], timeout=300)
    checks.ok_run(r, "2 ranks, not stopped")
    r = mixtest.mixtrain(TRAIN + ["--save", ref1], timeout=300)
    checks.ok_run(r, "1 rank, not stopped")

    # SIGUSR1 to mpirun: passed on to both ranks at once.
    save = tmp / "usr1.safetensors"
    job = [*mixrun, "--", mixtest.MIXTRAIN, *TRAIN, "--save", save, "--save-every", "1000", "--resume", "auto"]
    t0 = time.monotonic()
    rc, out, after = run_and_signal(job, r"step 1000/", lambda p: p.send_signal(signal.SIGUSR1))
    sig, step = stopped_step(out)
    checks.check(rc == 75, "SIGUSR1 to mpirun: the job exits 75", f"exit {rc}, {out[-1500:] if rc != 75 else ''}")
    # mpirun signals the ranks one after the other: rank 1 may get it a step later.
    checks.check(sig in ("SIGUSR1 (received by 2 of 2 ranks)", "SIGUSR1 (received by 1 of 2 ranks)") and step and
                 1000 < step < STEPS, "SIGUSR1 to mpirun: rank 0 says the ranks stopped after the same step",
                 f"{sig} at {step}")
    # mpirun waits 2 x its 1 s kill delay after a rank's non-zero exit; the rest is the step and the save.
    checks.check(after is not None and after < 20, "SIGUSR1 to mpirun: the job ends soon after the signal",
                 f"{after:.1f} s" if after else "no signal sent")
    checks.check(marker_step(save) == step, "the stop's checkpoint has its completion marker, at the stop's step",
                 f"marker {marker_step(save)}, stopped at {step}")
    checks.check("resume with the same command and --resume auto" in out, "the log says how to resume")
    metrics_note = re.search(r"nothing was saved", out)
    checks.check(not metrics_note, "a run with --save does not say nothing was saved")
    r = mixtest.launch(job, timeout=300)
    checks.ok_run(r, "resumed with --resume auto")
    checks.check(f"newest complete checkpoint (step {step})" in r.out and f"resumed from {save} at step {step}" in r.out,
                 "--resume auto takes the stop's checkpoint", r.out[-800:] if "resumed from" not in r.out else "")
    same_parameters(checks, ref2, save, "stopped by SIGUSR1 and resumed: the same parameters and optimizer state "
                                        "as the run never stopped, bit for bit")
    print(f"(SIGUSR1 case: {time.monotonic() - t0:.1f} s)")

    # SIGTERM to rank 1 alone: rank 0 stops at the same step.
    tag = uuid.uuid4().hex
    save = tmp / "term1.safetensors"
    job = [*mixrun, "--", mixtest.MIXTRAIN, *TRAIN, "--save", save, "--resume", "auto"]

    def term_rank1(p):
        pids = rank_pids(tag, 1)
        checks.check(len(pids) == 1, "rank 1's process is found", f"{pids}")
        for pid in pids:
            os.kill(pid, signal.SIGTERM)

    rc, out, _ = run_and_signal(job, r"step 1000/", term_rank1, env_extra={"MIX_TEST_TAG": tag})
    sig, step = stopped_step(out)
    checks.check(rc == 75 and sig == "a stop signal that 1 of 2 ranks received" and step,
                 "SIGTERM to rank 1 only: both ranks stop after the same step, rank 0 says one rank received it",
                 f"exit {rc}, {sig} at {step}")
    r = mixtest.launch(job, timeout=300)
    checks.ok_run(r, "resumed after rank 1's SIGTERM")
    same_parameters(checks, ref2, save, "stopped on one rank and resumed: bit for bit the run never stopped")

    # SIGTERM to mpirun: it passes SIGTERM on after --stop-grace seconds and
    # stops reading the ranks' output meanwhile, so rank 0 may block on a log
    # line into a full pipe until the SIGTERM reaches it; from then its log
    # lines are dropped (launch/stop_signals.cc) and the checkpoint is written.
    save = tmp / "term_mpirun.safetensors"
    job = [MIXRUN, "-n", "2", "--oversubscribe", "--stop-grace", "5", "--mpirun", mixtest.MPIRUN, "--",
           mixtest.MIXTRAIN, *TRAIN, "--steps", "4000000", "--save", save]
    rc, out, after = run_and_signal(job, r"step 1000/", lambda p: p.send_signal(signal.SIGTERM))
    tensors, meta = mixtest.load_checkpoint(save) if save.exists() else ({}, {})
    checks.check(rc != 0 and marker_step(save) and meta.get("step") == str(marker_step(save)),
                 "SIGTERM to mpirun: the ranks save a checkpoint with its marker within mpirun's grace",
                 f"exit {rc} after {after:.1f} s, marker {marker_step(save)}, file's step {meta.get('step')}")

    # One rank: the history of --keep-checkpoints, --resume auto's fresh start
    # and its passing over a checkpoint cut short.
    save = tmp / "one.safetensors"
    job = [mixtest.MIXTRAIN, *TRAIN, "--save", save, "--save-every", "500", "--keep-checkpoints", "3",
           "--resume", "auto"]
    rc, out, _ = run_and_signal(job, r"step 2000/", lambda p: p.send_signal(signal.SIGINT))
    sig, step = stopped_step(out)
    checks.check(rc == 75 and sig == "SIGINT (received by 1 of 1 ranks)", "SIGINT on one rank: exit 75",
                 f"exit {rc}, {sig}")
    checks.check("no complete checkpoint" in out and "starting from the beginning" in out,
                 "--resume auto with no checkpoint yet starts afresh, and says so")
    history = sorted(tmp.glob("one.step*.safetensors"))
    checks.check(len(history) == 2 and all(marker_step(h) for h in history),
                 "--keep-checkpoints 3: the newest and the 2 before it, each with its marker",
                 f"{[h.name for h in history]}")
    newest_history = max(history, key=lambda h: marker_step(h) or 0)
    newest_history_step = marker_step(newest_history)  # now: the resumed run will prune it
    data = save.read_bytes()
    save.write_bytes(data[: len(data) // 2])  # a save cut short
    r = mixtest.launch(job, timeout=300)
    checks.ok_run(r, "resumed past a checkpoint cut short")
    checks.check("passing over" in r.out and f"resumed from {newest_history} at step {newest_history_step}"
                 in r.out, "--resume auto passes over the file cut short and takes the one before it",
                 r.out[-800:])
    same_parameters(checks, ref1, save, "resumed from the history: bit for bit the run never stopped")

    # --stop-signals none: SIGTERM's default action, at once.
    rc, out, _ = run_and_signal([mixtest.MIXTRAIN, *TRAIN, "--stop-signals", "none"], r"step 1000/",
                                lambda p: p.send_signal(signal.SIGTERM))
    checks.check(rc == -signal.SIGTERM, "--stop-signals none: SIGTERM ends the process at once", f"exit {rc}")
    r = mixtest.mixtrain(TRAIN + ["--stop-signals", "TERM,KILL"])
    checks.check(r.rc == 2 and "'KILL' is not a stop signal" in r.out, "--stop-signals KILL is refused",
                 r.out[-300:])
    checks.finish()


if __name__ == "__main__":
    main()
