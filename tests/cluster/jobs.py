"""Helpers of the cluster tests: a job run until a line of its output appears,
then signalled; the processes of one rank of a job."""
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import mixtest


def start(cmd, env_extra=None):
    env = dict(os.environ)
    env.update(mixtest.THREAD_ENV)
    env.update(env_extra or {})
    return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", env=env, start_new_session=True)


def run_and_signal(cmd, wanted, send, env_extra=None, timeout=180):
    """Runs `cmd`; when a line of its output matches `wanted`, calls send(process)
    once. Returns (exit status, output, seconds from the signal to the exit)."""
    p = start(cmd, env_extra)
    lines, sent_at = [], None
    deadline = time.monotonic() + timeout
    try:
        for line in p.stdout:
            lines.append(line)
            if sent_at is None and re.search(wanted, line):
                send(p)
                sent_at = time.monotonic()
            if time.monotonic() > deadline:
                break
        p.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return p.returncode, "".join(lines), (time.monotonic() - sent_at) if sent_at else None


def rank_pids(tag, rank):
    """The mixtrain processes of the job tagged `tag` (an environment variable) with world rank `rank`."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"MIX_TEST_TAG={tag}".encode() in env and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            pids.append(int(d.name))
    return pids


