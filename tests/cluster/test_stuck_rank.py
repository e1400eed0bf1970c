"""A stuck rank never hangs the job: with 3 ranks under mixrun, `kill -STOP` on
rank 1 mid-training makes the others' collective pass --collective-timeout; a
waiting rank asks every peer where it is, names rank 1 (no answer) and the
collective and step it waits in, and the job ends with exit 124 well before
any test timeout, with no process left behind (the stopped one included).
A healthy job with a short timeout is not disturbed by it."""
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
TIMEOUT_S = 5
TRAIN = ["--data", "synthetic", "--synthetic-size", "1024", "--synthetic-features", "32", "--hidden", "16",
         "--batch-size", "32", "--eval", "false", "--lr", "0.05", "--log-every", "200", "--check-every", "0",
         "--collective-timeout", str(TIMEOUT_S)]


def main():
    mixtest.require_mixtrain()
    mixtest.require_mpirun()
    checks = mixtest.Checks("stuck rank")
    mixrun = [MIXRUN, "-n", "3", "--oversubscribe", "--mpirun", mixtest.MPIRUN, "--"]

    # A healthy job whose every collective is far shorter than the timeout.
    r = mixtest.launch([*mixrun, mixtest.MIXTRAIN, *TRAIN, "--steps", "300"], timeout=120)
    checks.ok_run(r, f"3 ranks with --collective-timeout {TIMEOUT_S}, nobody stuck")

    tag = uuid.uuid4().hex
    stopped = []

    def stop_rank1(_):
        stopped.extend(rank_pids(tag, 1))
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)

    t0 = time.monotonic()
    rc, out, after = run_and_signal([*mixrun, mixtest.MIXTRAIN, *TRAIN, "--steps", "10000000"], r"step 1000/",
                                    stop_rank1, env_extra={"MIX_TEST_TAG": tag}, timeout=120)
    checks.check(len(stopped) == 1, "rank 1's process is found and stopped", f"{stopped}")
    checks.check(rc == 124, "the job ends with the collective timeout's exit status 124", f"exit {rc}")
    # The timeout, a grace of 1 s for the peers' answers, and mpirun's abort.
    checks.check(after is not None and after < TIMEOUT_S + 20,
                 f"it ends within {TIMEOUT_S + 20} s of the stop", f"{after:.1f} s" if after else "no stop sent")
    report = re.search(r"\[rank (\d)/3\] \[error\] (.*) has waited (\d+) s for the other ranks \(--collective-timeout "
                       r"(\d+)\); it waits for rank\(s\) ([\d, ]+), which did not answer", out)
    checks.check(report is not None, "a waiting rank reports the timeout", out[-1500:] if report is None else "")
    if report:
        reporter, where, waited, limit, silent = report.groups()
        checks.check(reporter in ("0", "2") and silent == "1", "it names rank 1, the stopped one, as the rank it waits for",
                     f"rank {reporter} waits for {silent}")
        checks.check(re.search(r"all_reduce .*at step \d+", where) is not None,
                     "it names the collective and the step", where)
        checks.check(int(waited) >= TIMEOUT_S and limit == str(TIMEOUT_S), "it waited the timeout, no less",
                     f"{waited} s of {limit}")
        checks.check(re.search(r"rank 1: no answer within \d+ s \(stopped", out) is not None and
                     re.search(r"rank [02]: waiting in .*all_reduce", out) is not None,
                     "each peer's state: rank 1 silent, the other waiting in the same collective")
    time.sleep(1)
    alive = [pid for pid in stopped if Path(f"/proc/{pid}").exists() and
             "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()]
    checks.check(not alive, "the stopped rank did not outlive the job", f"{alive}")
    for pid in alive:  # never leave a stopped process behind
        os.kill(pid, signal.SIGKILL)
    print(f"(stuck-rank case: {time.monotonic() - t0:.1f} s)")
    checks.finish()


if __name__ == "__main__":
    main()
