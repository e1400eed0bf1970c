#!/usr/bin/env python3
"""mixtrain under a real Slurm: a one-node cluster started here (slurm_cluster.py)
runs a tiny 2-rank training

  (a) through sbatch, whose script calls `mixrun -- mixtrain ...` with no -n
      (mixrun takes SLURM_NTASKS; mpirun must pick Slurm's launcher and
      allocation, plm/ras slurm). The same script first runs one plain
      mixtrain and a `mixrun -n 1`, which the singleton check must let through;
  (b) through `srun --mpi=pmix -n 2 mixtrain ...` (pmi2 when srun has no pmix),
      reported as NOT RUN, never as passed, when neither plugin forms the job;
  (c) through `srun --mpi=none -n 2 mixtrain ...`, where each task must stop with
      exit 2 and the singleton message instead of training alone.

Skips (77) when not root or when Slurm is not installed (scripts/setup.sh
installs it). Daemons are stopped whatever happens. Run by hand:

    MIX_BUILD_DIR=build-cpu /usr/bin/python3 tests/cluster/test_slurm.py
"""
import os
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "e2e"))
sys.path.insert(0, str(HERE))
import mixtest  # noqa: E402
from slurm_cluster import SlurmCluster, SlurmError, missing_for_training  # noqa: E402

MIXTRAIN = mixtest.MIXTRAIN
MIXRUN = mixtest.BUILD_DIR / "mixrun"
TRAIN_ARGS = ["--model", "mlp", *map(str, mixtest.synthetic(size=256)), "--steps", "5", "--batch-size", "16",
              "--log-every", "1"]
SINGLETON = "did not join the others"

failures = []
timings = mixtest.Timings()
timed = timings.timed


def check(ok, what, detail=""):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)
        if detail:
            print("     " + detail.replace("\n", "\n     "))


def quoted(args):
    return " ".join(f"'{a}'" for a in args)


def batch_with_mixrun(cluster):
    """(a): sbatch -n 2; the script runs mixtrain alone, mixrun -n 1, then mixrun with no -n."""
    train = quoted([MIXTRAIN, *TRAIN_ARGS])
    script = f"""#!/bin/bash
set -u
echo "== plain: one process in the batch script"
{train} --steps 2; echo "plain exit $?"
echo "== mixrun -n 1"
'{MIXRUN}' -n 1 -- {train} --steps 2; echo "mixrun-1 exit $?"
echo "== mixrun (SLURM_NTASKS ranks)"
# plm/ras verbosity: mpirun names the launcher and allocation components it selected.
OMPI_MCA_plm_base_verbose=10 OMPI_MCA_ras_base_verbose=10 '{MIXRUN}' -- {train}
rc=$?; echo "mixrun exit $rc"; exit $rc
"""
    job = cluster.sbatch(script, ["-n", "2", "--time", "5"], env=mixtest.THREAD_ENV)
    info = cluster.wait_job(job, timeout=240)
    out = mixtest._ANSI.sub("", cluster.job_output(job))
    detail = out[-4000:]
    check(info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0",
          f"(a) sbatch job {job}: COMPLETED with exit 0:0 (got {info.get('JobState')} {info.get('ExitCode')})", detail)
    check("plain exit 0" in out, "(a) a single mixtrain in the batch script (SLURM_NTASKS=2, no step) trains", detail)
    check("mixrun-1 exit 0" in out, "(a) mixrun -n 1 inside the 2-task allocation trains", detail)
    check(f"inside Slurm job {job} on {cluster.node}" in out, "(a) mixrun says it launches inside the Slurm job", detail)
    mixrun_part = out.split("== mixrun (SLURM_NTASKS ranks)", 1)[-1]
    line = re.search(r"^mixrun: \S*(mpirun|mpiexec) .*$", mixrun_part, re.M)
    check(line is not None and " -n 2 " in line.group(0) and "--oversubscribe" not in line.group(0),
          "(a) mixrun took -n 2 from SLURM_NTASKS and did not oversubscribe", line.group(0) if line else mixrun_part[:3000])
    check(re.search(r"select:\(\s*plm\) Selected component \[slurm\]", mixrun_part) is not None,
          "(a) mpirun selected Slurm's launcher (plm slurm)", detail)
    check(re.search(r"select:\(\s*ras\) Selected component \[slurm\]", mixrun_part) is not None,
          "(a) mpirun took the allocation from Slurm (ras slurm)", detail)
    check("2 rank(s)" in mixrun_part, "(a) the training ran on 2 ranks", detail)
    check("mixrun exit 0" in out, "(a) mixrun -- mixtrain exited 0", detail)


def srun_with_pmi(cluster):
    """(b): srun --mpi=pmix (else pmi2) -n 2 mixtrain: one job of 2 ranks."""
    plugins = cluster.mpi_plugins()
    print(f"     srun --mpi=list: {', '.join(sorted(plugins)) or '(none)'}")
    tried = []
    for plugin in ("pmix", "pmi2"):
        if plugin not in plugins:
            continue
        rc, out, err, secs = cluster.run(["srun", f"--mpi={plugin}", "-n", "2", MIXTRAIN, *TRAIN_ARGS],
                                         timeout=180, env=mixtest.THREAD_ENV)
        text = mixtest._ANSI.sub("", out + err)
        if rc == 0 and "2 rank(s)" in text:
            check(SINGLETON not in text, f"(b) srun --mpi={plugin} -n 2 mixtrain: one job of 2 ranks, exit 0 "
                  f"({secs:.1f} s)", text[-3000:])
            return
        tried.append(f"--mpi={plugin}: exit {rc}: {text.strip()[-800:]}")
    # Not a failure of mixtrain: this Slurm or this MPI cannot do direct launch. Said plainly, not passed.
    print("NOT RUN (b) srun -n 2 mixtrain with PMI: "
          + ("; ".join(tried) if tried else f"srun offers neither pmix nor pmi2 ({sorted(plugins)})"))


def srun_without_pmi(cluster):
    """(c): srun --mpi=none -n 2: each task must stop with exit 2 and say why."""
    rc, out, err, secs = cluster.run(["srun", "--mpi=none", "-n", "2", MIXTRAIN, *TRAIN_ARGS], timeout=120,
                                     env=mixtest.THREAD_ENV)
    text = mixtest._ANSI.sub("", out + err)
    detail = f"exit {rc}\n{text[-3000:]}"
    check(rc == 2, f"(c) srun --mpi=none -n 2 mixtrain exits 2 (got {rc}, {secs:.1f} s)", detail)
    check(text.count(SINGLETON) == 2, "(c) both tasks print the singleton message", detail)
    check("task 0" in text and "task 1" in text, "(c) each task names itself", detail)
    check("srun --mpi=pmix -n N mixtrain" in text and "mixrun -n N -- mixtrain" in text,
          "(c) the message names the two launches that work", detail)
    check("step 1/" not in text and "loss" not in text.lower(), "(c) no task trained", detail)


def main():
    why = missing_for_training()
    if why:
        mixtest.skip(why)
    mixtest.require_mixtrain()
    if not os.access(MIXRUN, os.X_OK):
        print(f"FAIL: {MIXRUN} is not built")
        return 1

    t0 = time.monotonic()
    cluster = SlurmCluster()
    try:
        timed("start munged, slurmctld, slurmd", cluster.start)
        print(f"     one-node cluster: node {cluster.node}, {cluster.cpus} CPUs, {cluster.dir}")
        timed("(a) sbatch + mixrun", lambda: batch_with_mixrun(cluster))
        timed("(b) srun with PMI", lambda: srun_with_pmi(cluster))
        timed("(c) srun --mpi=none", lambda: srun_without_pmi(cluster))
    except SlurmError as e:
        check(False, "the Slurm cluster worked", str(e))
        print("slurmctld log:\n" + cluster.log("slurmctld") + "\nslurmd log:\n" + cluster.log("slurmd"))
    finally:
        timed("stop", cluster.stop)
    timings.print()
    print(f"time {time.monotonic() - t0:6.1f} s  in all")
    if failures:
        print(f"FAIL: {len(failures)} check(s) failed")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
