#!/usr/bin/env python3
"""Preemption under a real Slurm, through the shipped example job script.

A one-node cluster started here (slurm_cluster.py) runs
scripts/slurm/train_1node_8gpu.sbatch itself, submitted with sbatch: two
tasks instead of eight and no GPUs (sbatch's command line overrides the
script's #SBATCH lines), a tiny CPU training through the script's TRAIN_ARGS
and RUN_DIR, and this build's mixrun and mixtrain first on PATH. So the
script's trap, its wait loop, its `scontrol requeue` on exit 75 and its
`--resume auto` are what is tested, not a copy of them.

Once the job is training, `scancel --batch --signal=USR1` (what the example
documents) must end in: both ranks stopping after the same step, a complete
checkpoint of that step with its completion marker, the job requeued
(Restarts=1), the second run resuming from that checkpoint and finishing
(COMPLETED, 0:0), and the final parameters and optimizer state equal bit for
bit to those of a run never stopped (run here without Slurm, through mixrun).
No early signal (one that lands while mpirun is still starting the ranks) is
tested: tried three times at mixrun's first line, the signal was lost each
time (mpirun had no ranks to forward it to) and the job trained to the end
unstopped, which docs/cluster.md describes; there is nothing to assert that
mixtrain controls.

Slurm holds a requeued job about two minutes (its BeginTime) before it may
start again; the test checks the stop's files during that hold and then, two
seconds on, releases the job with `scontrol update StartTime=now`.

Skips (77) when not root, without Slurm (scripts/setup.sh installs it) or
without MPI. Run by hand:

    MIX_BUILD_DIR=build-cpu /usr/bin/python3 tests/cluster/test_slurm_preemption.py
"""
import json
import os
import re
import sys
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "e2e"))
sys.path.insert(0, str(HERE))
import mixtest  # noqa: E402
from slurm_cluster import SlurmCluster, SlurmError, missing_for_training  # noqa: E402

MIXRUN = mixtest.BUILD_DIR / "mixrun"
SCRIPT = mixtest.SOURCE_DIR / "scripts" / "slurm" / "train_1node_8gpu.sbatch"
# The training: a step's time varies by more than ten times with the load on
# shared cores, and the signal takes seconds from the first progress line
# through scancel, slurmctld, slurmd, the batch shell's trap and mpirun to a
# stopped, requeued job. So the step count comes from
# two short timed runs, for a run of about RUN_SECONDS: mid-run when the
# signal lands, whatever the machine's pace, and not much longer.
RUN_SECONDS = 10
TRAIN = ["--model", "mlp", "--data", "synthetic", "--synthetic-size", "1024", "--synthetic-features", "32",
         "--hidden", "16", "--batch-size", "32", "--eval", "false", "--log-every", "200"]
STEPS = None  # set by main(), from calibrate()
STOP_LINE = re.compile(r"stopped by (.*?) at step (\d+) of (\d+); saved (\S+);")

checks = mixtest.Checks("slurm_preemption")
timings = mixtest.Timings()
timed = timings.timed


def check(ok, what, detail=""):
    """checks.check, with the detail (often the job's output) shown only on failure."""
    return checks.check(ok, what, "" if ok else detail)


def wait_for(what, ready, timeout, poll=0.1):
    """Polls ready() until it returns something true; raises SlurmError after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(poll)
    raise SlurmError(f"timed out after {timeout} s waiting for {what}")


def marker_of(path):
    """The completion marker's fields of checkpoint `path`, or {}."""
    try:
        return json.loads(Path(str(path) + ".complete").read_text())
    except (OSError, ValueError):
        return {}


def preempt_and_resume(cluster, name, signal_when, reference, tmp):
    """Submits the example; when signal_when(output) matches, preempts it with
    scancel --batch --signal=USR1; checks the stop, the requeue, the resumed
    run and its final parameters against `reference`."""
    run_dir = tmp / name
    env = dict(mixtest.THREAD_ENV)
    # The job runs in the cluster's folder: absolute paths only.
    path = f"{mixtest.BUILD_DIR.resolve()}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    env.update({"PATH": path, "RUN_DIR": str(run_dir), "TRAIN_ARGS": " ".join(TRAIN + ["--steps", str(STEPS)])})
    # The script asks for 8 tasks with 8 GPUs; this node has 2 cores and no GPUs.
    job = cluster.sbatch(SCRIPT.read_text(), ["--ntasks-per-node=2", "--gpus-per-node=0"], env=env)
    t_submit = time.monotonic()
    out = lambda: mixtest._ANSI.sub("", cluster.job_output(job))  # noqa: E731

    # 1. Training under way (or just starting), then the preemption notice.
    def reached():
        if signal_when(out()):
            return True
        if cluster.job_info(job).get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING"):
            raise SlurmError(f"job {job} ended before the signal: {cluster.job_info(job)}\n{out()[-3000:]}")
        return False

    wait_for(f"job {job} to reach the signal point", reached, timeout=120, poll=0.05)
    t_signal = time.monotonic()
    rc, _, err, _ = cluster.run(["scancel", "--batch", "--signal=USR1", str(job)], timeout=15)
    check(rc == 0, f"{name}: scancel --batch --signal=USR1 {job} accepted", err.strip())

    # 2. The stop: the script sees exit 75 and requeues; the job is COMPLETING
    # while Slurm ends the first run's batch step, then PENDING, held.
    def requeued():
        i = cluster.job_info(job)
        if i.get("Restarts", "0") != "0" and i.get("JobState") == "PENDING":
            return i
        if i.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return i
        return None

    info = wait_for(f"job {job} to be requeued", requeued, timeout=120)
    t_requeued = time.monotonic()
    first = out()
    detail = first[-3000:]
    m = STOP_LINE.search(first)
    check(info.get("Restarts") == "1" and info.get("JobState") == "PENDING",
          f"{name}: the job requeued itself after the stop (Restarts=1, PENDING)",
          f"{info.get('JobState')} Restarts={info.get('Restarts')} {info.get('ExitCode')}\n{detail}")
    # mpirun signals the ranks one after the other, and a step takes a tenth
    # of a millisecond: rank 1 may get it a step after rank 0. The count is
    # of the ranks that had it at the step they all stopped after.
    check(m is not None and re.fullmatch(r"SIGUSR1 \(received by [12] of 2 ranks\)", m.group(1)) is not None,
          f"{name}: rank 0 says the 2 ranks stopped after one step, on SIGUSR1", detail if not m else m.group(0))
    check(re.search(r"Exit code:\s+75\b", first) is not None,
          f"{name}: mpirun reports a rank's exit status 75 (stopped, saved)", detail)
    if not m:
        cluster.run(["scancel", str(job)], timeout=15)
        return
    step, save = int(m.group(2)), Path(m.group(4))
    print(f"     {name}: {m.group(1)} at step {step} of {STEPS}, requeued {t_requeued - t_signal:.1f} s after "
          "the signal")
    check(0 < step < STEPS and int(m.group(3)) == STEPS, f"{name}: the stop came mid-run", f"step {step}")
    check(save == run_dir / "model.safetensors", f"{name}: saved where the script's --save says", str(save))

    # 3. During the hold: the stop's checkpoint and its marker, checked here
    # independently of mixtrain's reader (size and CRC-32 of the bytes).
    marker = marker_of(save)
    data = save.read_bytes() if save.exists() else b""
    check(marker.get("step") == step and marker.get("bytes") == len(data) and
          marker.get("crc32") == format(zlib.crc32(data), "x"),
          f"{name}: the checkpoint is complete: its marker names step {step}, its size and its CRC-32",
          f"marker {marker}, file {len(data)} bytes crc {format(zlib.crc32(data), 'x')}")
    _, meta = mixtest.load_checkpoint(save) if data else ({}, {})
    check(meta.get("step") == str(step), f"{name}: the checkpoint's own metadata says step {step}",
          f"{meta.get('step')}")
    eligible = info.get("EligibleTime", "?")
    print(f"     {name}: Slurm holds the requeued job until {eligible} (Reason={info.get('Reason')}); releasing it")
    # Not in the second of the first run's kill: slurmd refuses to launch a
    # job whose credential it revoked in the same second as the new one was
    # made ("Job N already killed, do not launch batch job"; the job FAILS).
    # Slurm's own hold keeps clear of that; this shortcut must too.
    time.sleep(2)
    rc, _, err, _ = cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], timeout=15)
    check(rc == 0, f"{name}: the requeued job is released", err.strip())

    # 4. The second run: --resume auto from the stop, to the end.
    info = cluster.wait_job(job, timeout=400)
    t_done = time.monotonic()
    whole = out()
    second = whole[len(first):]
    detail = second[-3000:]
    check(info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0" and info.get("Restarts") == "1",
          f"{name}: the requeued run finished: COMPLETED, exit 0:0, Restarts=1",
          f"{info.get('JobState')} {info.get('ExitCode')} Restarts={info.get('Restarts')}\n{detail}")
    check(f"newest complete checkpoint (step {step})" in second and
          f"resumed from {save} at step {step}" in second,
          f"{name}: the second run resumed with --resume auto from step {step}", detail)
    check(f"step {STEPS}/{STEPS}" in second and not STOP_LINE.search(second),
          f"{name}: the second run trained to step {STEPS} without stopping", detail)
    a, _ = mixtest.load_checkpoint(reference)
    b, meta = mixtest.load_checkpoint(save)
    bad = [k for k in sorted(set(a) | set(b)) if k not in a or k not in b or not mixtest.bit_identical(a[k], b[k])]
    check(not bad and meta.get("step") == str(STEPS),
          f"{name}: final parameters and optimizer state equal the uninterrupted run's, bit for bit",
          f"differ: {bad[:3]}, step {meta.get('step')}")
    timings.add(f"{name}: submit to signal", t_signal - t_submit)
    timings.add(f"{name}: signal to requeued", t_requeued - t_signal)
    timings.add(f"{name}: release to COMPLETED", t_done - t_requeued)


def calibrate(mixrun):
    """Steps for a run of about RUN_SECONDS on this machine now: the wall
    time of a step, all of it (the metrics' step_ms leaves out the host's
    work between steps), from the difference between a 6000-step and a
    1000-step run; at least 20000 steps and at most 400000 (a
    bound on the time when the timing ran on idle cores and the rest does
    not), rounded up to 10000s."""
    seconds = {}
    for n in (1000, 6000):
        r = mixtest.launch([*mixrun, "--", mixtest.MIXTRAIN, *TRAIN, "--steps", n], timeout=120)
        if not checks.ok_run(r, f"the timing run of {n} steps"):
            checks.finish()
        seconds[n] = r.seconds
    step_s = max((seconds[6000] - seconds[1000]) / 5000, 1e-6)
    steps = min(400_000, max(20000, -(-int(RUN_SECONDS / step_s) // 10000) * 10000))
    print(f"     {step_s * 1000:.3f} ms a step: {steps} steps")
    return steps


def main():
    global STEPS
    why = missing_for_training()
    if why:
        mixtest.skip(why)
    mixtest.require_mixtrain()
    mixtest.require_mpirun()
    if not os.access(MIXRUN, os.X_OK):
        print(f"FAIL: {MIXRUN} is not built")
        return 1
    if mixtest.safetensors_io is None:
        mixtest.skip("numpy is missing: the checkpoints cannot be compared")
    tmp = mixtest.workdir("slurm_preemption")
    os.chmod(tmp, 0o755)

    # As in the job: no --oversubscribe, so that mpirun binds each rank to a
    # core as it does under Slurm (the steps' pace differs several times).
    mixrun = [MIXRUN, "-n", "2", "--mpirun", mixtest.MPIRUN]
    STEPS = timed("timing runs", lambda: calibrate(mixrun))

    # The run never stopped, without Slurm.
    reference = tmp / "reference.safetensors"
    r = timed("reference run, 2 ranks, mixrun without Slurm",
              lambda: mixtest.launch([*mixrun, "--",
                                      mixtest.MIXTRAIN, *TRAIN, "--steps", STEPS, "--save", reference],
                                     timeout=600))
    if not checks.ok_run(r, "the uninterrupted reference"):
        checks.finish()

    cluster = SlurmCluster()
    try:
        timed("start munged, slurmctld, slurmd", cluster.start)
        print(f"     one-node cluster: node {cluster.node}, {cluster.cpus} CPUs, {cluster.dir}")
        # Mid-run: after the first progress line.
        timed("mid-run preemption", lambda: preempt_and_resume(
            cluster, "mid-run", lambda text: re.search(rf"step \d+/{STEPS}", text), reference, tmp))
    except SlurmError as e:
        checks.check(False, "the Slurm cluster worked", str(e))
        print("slurmctld log:\n" + cluster.log("slurmctld") + "\nslurmd log:\n" + cluster.log("slurmd"))
    finally:
        timed("stop the cluster", cluster.stop)
    timings.print()
    checks.finish()


if __name__ == "__main__":
    sys.exit(main())
