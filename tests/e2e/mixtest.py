"""Shared helpers of the end-to-end tests in tests/e2e: running mixtrain directly
or under mpirun (with a timeout that kills the whole process group, so a hung
job can never hang the test), reading the metrics JSON Lines and safetensors
checkpoints, and collecting check results.

CTest sets MIX_BUILD_DIR, MIX_SOURCE_DIR, MIX_MPIRUN and MIX_PYTHON; run by hand,
the defaults are the build/ folder of this checkout and the mpirun on PATH:

    /usr/bin/python3 tests/e2e/test_dp_equivalence.py

A test exits 0 (pass), 1 (a check failed) or 77 (skipped: CTest's SKIP_RETURN_CODE).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE_DIR = Path(os.environ.get("MIX_SOURCE_DIR") or Path(__file__).resolve().parents[2])
BUILD_DIR = Path(os.environ.get("MIX_BUILD_DIR") or SOURCE_DIR / "build")
MIXTRAIN = BUILD_DIR / "mixtrain"
MPIRUN = os.environ.get("MIX_MPIRUN") or shutil.which("mpirun") or ""
SKIP = 77

sys.path.insert(0, str(SOURCE_DIR / "tests" / "python"))
try:
    import safetensors_io  # noqa: E402  (tests/python, found through the path above)
except ImportError:  # no numpy (a GPU node's Python): only the tests that read or write safetensors need it
    safetensors_io = None

# One BLAS/OpenMP thread per process: several ranks share the 2 cores of CI, and
# one thread also makes a single-rank run's GEMMs independent of the core count.
THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


def require_mixtrain():
    if not os.access(MIXTRAIN, os.X_OK):
        print(f"FAIL: {MIXTRAIN} is not built (cmake --build {BUILD_DIR} --target mixtrain)")
        sys.exit(1)


def have_mpirun():
    return bool(MPIRUN) and shutil.which(MPIRUN) is not None


def require_mpirun():
    if os.environ.get("MIX_WITH_MPI") == "OFF":
        skip("this build has no MPI (MIX_WITH_MPI=OFF): multi-rank tests do not apply")
    if not have_mpirun():
        skip(f"no mpirun ({MPIRUN!r}); multi-rank tests need one (scripts/setup.sh installs Open MPI)")


def mpirun_flags():
    """The flags every mpirun launch takes here: root allowed, more ranks than cores, one BLAS thread."""
    flags = ["--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        flags.insert(0, "--allow-run-as-root")
    for k in THREAD_ENV:
        flags += ["-x", f"{k}=1"]
    return flags


class Result:
    """What one launch did. `out` is stdout and stderr together, colours stripped."""

    def __init__(self, cmd, rc, stdout, stderr, seconds, timed_out):
        self.cmd, self.rc, self.seconds, self.timed_out = cmd, rc, seconds, timed_out
        self.stdout = _ANSI.sub("", stdout)
        self.stderr = _ANSI.sub("", stderr)
        self.out = self.stdout + self.stderr

    def describe(self, tail=3000):
        what = "timed out" if self.timed_out else f"exit {self.rc}"
        return f"$ {' '.join(map(str, self.cmd))}\n  ({what} after {self.seconds:.1f} s)\n{self.out[-tail:]}"

    def expect_ok(self):
        """Raises with the command and its output unless it exited 0 in time."""
        if self.timed_out or self.rc != 0:
            raise AssertionError("command failed:\n" + self.describe())
        return self


def launch(cmd, timeout, env=None):
    """Runs `cmd` in its own session; on timeout kills the whole process group
    (mpirun and every rank it started), so nothing outlives the test."""
    full_env = dict(os.environ)
    full_env.update(THREAD_ENV)
    full_env.update(env or {})
    t0 = time.monotonic()
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         errors="replace", env=full_env, start_new_session=True)
    timed_out = False
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                out, err = p.communicate(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            out, err = "", ""
    return Result(cmd, p.returncode, out or "", err or "", time.monotonic() - t0, timed_out)


def mixtrain(args, np=1, timeout=120, mpi=None, env=None):
    """Runs mixtrain with `args` on `np` ranks: directly for one rank (the local
    communicator) unless mpi=True, under mpirun otherwise."""
    require_mixtrain()
    args = [str(a) for a in args]
    if np == 1 and not mpi:
        return launch([MIXTRAIN, *args], timeout, env)
    require_mpirun()
    return launch([MPIRUN, *mpirun_flags(), "-np", str(np), MIXTRAIN, *args], timeout, env)


def mixtrain_mpmd(groups, timeout=60, env=None):
    """One job of several app contexts (mpirun MPMD syntax `-np 1 prog a : -np 1 prog b`):
    groups is a list of (np, args); ranks are numbered in that order."""
    require_mixtrain()
    require_mpirun()
    cmd = [MPIRUN, *mpirun_flags()]
    for i, (np_, args) in enumerate(groups):
        if i:
            cmd.append(":")
        cmd += ["-np", str(np_), MIXTRAIN, *[str(a) for a in args]]
    return launch(cmd, timeout, env)


def synthetic(size=512, features=32, classes=5, hidden=(32, 16)):
    """Flags of a small learnable synthetic task and MLP."""
    return ["--data", "synthetic", "--synthetic-size", size, "--synthetic-features", features,
            "--synthetic-classes", classes, "--hidden", ",".join(map(str, hidden))]


class Metrics:
    """A metrics file: `steps` (per-step objects in order), `evals` and `summary`."""

    def __init__(self, path):
        self.steps, self.evals, self.summary = [], [], None
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                obj = json.loads(line)
                if obj.get("summary"):
                    self.summary = obj
                elif "eval_accuracy" in obj or "val_loss" in obj:
                    self.evals.append(obj)
                else:
                    self.steps.append(obj)

    def step(self, n):
        """The metrics object of optimizer step n (1-based, as written)."""
        for s in self.steps:
            if s["step"] == n:
                return s
        raise KeyError(f"no metrics line for step {n}")


def load_checkpoint(path):
    """(dict name -> numpy array, metadata dict) of a safetensors file."""
    return safetensors_io.load(path)


def parameters_only(tensors):
    return {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}


def rel_diff(a, b):
    """max |a - b| / max |a|: a norm-wise relative difference that stays meaningful for elements near 0."""
    import numpy as np  # here, not at the top: tests that compare no arrays also run where numpy is missing (a GPU node)

    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    scale = float(np.max(np.abs(a))) if a.size else 0.0
    d = float(np.max(np.abs(a - b))) if a.size else 0.0
    return d / scale if scale > 0 else d


def bit_identical(a, b):
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---- --print-program's op lines: `  12: out:f16[?, 8] = type(X=a, Y=[b, c]) {attr=1}` ----
_OP_LINE = re.compile(r"^\s*(\d+): (.*?) = (\w+)\((.*?)\)(?: \{(.*)\})?\s*$")


class ProgramOp:
    """One printed op: its index, output text, type, input text and attribute text."""

    def __init__(self, index, outs, type_, ins, attrs):
        self.index, self.outs_text, self.type, self.ins_text, self.attrs = index, outs, type_, ins, attrs

    def outputs(self):
        """{name: dtype} of the op's outputs."""
        return {m.group(1): m.group(2) for m in re.finditer(r"([\w.@]+):(\w+)\[", self.outs_text)}

    def inputs(self):
        """The variable names the op reads (its "Slot=name" and "Slot=[a, b]" arguments, slots dropped)."""
        return set(re.findall(r"[\w.@]+", re.sub(r"[\w@.]+=", "", self.ins_text)))

    def attr(self, name):
        """An attribute's printed value (text), or None."""
        m = re.search(r"(?:^|, )" + re.escape(name) + r"=([^,]*)", self.attrs)
        return m.group(1) if m else None


def program_ops(text):
    """{index: ProgramOp} of the ops --print-program printed."""
    ops = {}
    for line in text.splitlines():
        m = _OP_LINE.match(line)
        if m:
            ops[int(m.group(1))] = ProgramOp(int(m.group(1)), m.group(2), m.group(3), m.group(4), m.group(5) or "")
    return ops


class Checks:
    """Collects named checks; prints each as it is made; finish() sets the exit status."""

    def __init__(self, name):
        self.name, self.failed, self.passed = name, [], 0
        self.t0 = time.monotonic()

    def check(self, ok, what, detail=""):
        line = f"{'ok  ' if ok else 'FAIL'} {what}" + (f"  [{detail}]" if detail else "")
        print(line, flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)
        return ok

    def ok_run(self, result, what):
        """Checks that a run exited 0 in time; prints its output when not. Returns whether it did."""
        ok = not result.timed_out and result.rc == 0
        self.check(ok, f"{what}: run succeeds", f"{result.seconds:.1f} s")
        if not ok:
            print(result.describe(), flush=True)
        return ok

    def finish(self):
        secs = time.monotonic() - self.t0
        if self.failed:
            print(f"FAIL: {self.name}: {len(self.failed)} of {self.passed + len(self.failed)} checks failed "
                  f"({secs:.1f} s):")
            for f in self.failed:
                print(f"  - {f}")
            sys.exit(1)
        print(f"PASS: {self.name}: {self.passed} checks ({secs:.1f} s)")
        sys.exit(0)


class Timings:
    """Wall time of a test's named parts, printed at its end: where a slow or
    stuck run spent its time."""

    def __init__(self):
        self.parts = []

    def timed(self, name, fn):
        """fn()'s result; its time is kept under `name` even when it raises."""
        t0 = time.monotonic()
        try:
            return fn()
        finally:
            self.add(name, time.monotonic() - t0)

    def add(self, name, secs):
        self.parts.append((name, secs))

    def print(self):
        for name, secs in self.parts:
            print(f"time {secs:6.1f} s  {name}")


def load_script(path):
    """A Python script (scripts/NAME.py) as a module named NAME; its main does not run."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def workdir(name):
    """A fresh temporary directory, removed at exit unless MIX_KEEP_TMP is set."""
    d = tempfile.mkdtemp(prefix=f"mix_{name}_")
    if not os.environ.get("MIX_KEEP_TMP"):
        import atexit

        atexit.register(shutil.rmtree, d, ignore_errors=True)
    else:
        print(f"(keeping {d})")
    return Path(d)
