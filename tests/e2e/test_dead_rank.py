"""A dead rank must not leave the others hanging: rank 1 of a 2-rank training job
is killed with SIGKILL mid-run; the job must end, non-zero, within a bound,
and rank 0 must not be left running."""
import os
import signal
import subprocess
import sys
import time

import mixtest


# Marks this test's processes, so that a concurrently running test's ranks are never touched.
MARK = f"MIX_DEAD_RANK_TEST={os.getpid()}"


def rank_pids(rank):
    """PIDs of this test's mixtrain processes whose environment says OMPI_COMM_WORLD_RANK=rank."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if not f.read().split(b"\0")[0].endswith(b"mixtrain"):
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
                if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env and MARK.encode() in env:
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


def main():
    mixtest.require_mixtrain()
    mixtest.require_mpirun()
    checks = mixtest.Checks("dead_rank")
    # Long enough that it is still training when the kill comes.
    cmd = [mixtest.MPIRUN, *mixtest.mpirun_flags(), "-x", MARK, "-np", "2", str(mixtest.MIXTRAIN), "--data", "synthetic",
           "--synthetic-size", "4096", "--synthetic-features", "64", "--hidden", "32", "--batch-size", "16",
           "--steps", "1000000", "--eval", "false", "--log-every", "1000"]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        victims = []
        deadline = time.time() + 30
        while time.time() < deadline and not victims:
            time.sleep(0.5)
            victims = rank_pids(1)
        checks.check(bool(victims), "found rank 1's process")
        time.sleep(1.0)  # let it get into the training loop
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        t0 = time.time()
        try:
            out, _ = job.communicate(timeout=60)
            ended = True
        except subprocess.TimeoutExpired:
            ended, out = False, b""
        secs = time.time() - t0
        checks.check(ended, f"the job ended after rank 1 was killed ({secs:.1f} s)")
        checks.check(ended and job.returncode != 0, f"with a non-zero status ({job.returncode})")
        time.sleep(0.5)
        checks.check(not rank_pids(0), "rank 0 is not left running")
        if ended:
            tail = out.decode(errors="replace").strip().splitlines()[-3:]
            print("     > " + "\n     > ".join(tail))
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
