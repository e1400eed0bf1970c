"""A throwaway one-node Slurm cluster on this machine, for the cluster tests.

    with SlurmCluster() as cluster:          # starts munged, slurmctld, slurmd
        r = cluster.run(["srun", "-n", "2", "hostname"], timeout=60)
        job = cluster.sbatch(script_text)    # the job id
        state = cluster.wait_job(job, timeout=120)

Everything it writes (munge key and socket, slurm.conf, state, spool, logs) is
under one temporary folder, and its daemons listen on ports picked free at
start, so it neither reads nor disturbs a Slurm or munge the machine may
already run, and two tests can each have their own. The daemons run in the
foreground as children of the test; stop() (also on leaving the `with`)
signals each by its pid, TERM first and KILL after a grace, whatever
happened before.

It needs root (slurmd starts job steps as the submitting user) and the Debian
packages munge, slurmctld, slurmd and slurm-client (scripts/setup.sh);
missing() says what is lacking so a test can skip with the reason.

The configuration is the least that works in a container without systemd:
processes are tracked through /proc (proctrack/linuxproc) rather than
cgroups, tasks are not bound (task/none), and there is no accounting.
"""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd"}
CLIENTS = ["sbatch", "srun", "scontrol", "sinfo", "squeue", "scancel"]


def missing():
    """Why this machine cannot start the cluster (a sentence), or None when it can."""
    if os.geteuid() != 0:
        return "the Slurm cluster tests need root (slurmd starts each job step as its user)"
    lacking = [name for name, path in DAEMONS.items() if not os.access(path, os.X_OK)]
    lacking += [name for name in CLIENTS if shutil.which(name) is None]
    if lacking:
        return ("Slurm is not installed (missing " + ", ".join(lacking) +
                "); scripts/setup.sh installs munge, slurmctld, slurmd and slurm-client")
    return None


def missing_for_training():
    """missing(), else why this build has nothing for Slurm to launch (no MPI:
    CTest passes MIX_WITH_MPI=OFF), else None. The tests that train under
    Slurm skip with this reason."""
    why = missing()
    if not why and os.environ.get("MIX_WITH_MPI") == "OFF":
        why = "this build has no MPI (MIX_WITH_MPI=OFF): nothing to launch under Slurm"
    return why


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmError(RuntimeError):
    pass


class SlurmCluster:
    """One node named after this host, `cpus` CPUs (default: this machine's, at
    least 2 so that 2-task jobs fit), one partition `debug`. `kill_wait` is
    slurm.conf's KillWait: seconds between a job's SIGTERM and its SIGKILL at
    cancellation or time limit. `extra_conf` lines are appended to slurm.conf."""

    def __init__(self, cpus=None, kill_wait=5, extra_conf=(), keep=False):
        self.cpus = cpus or max(2, os.cpu_count() or 1)
        self.kill_wait = kill_wait
        self.extra_conf = list(extra_conf)
        self.keep = keep  # keep the folder (logs) after stop(), for debugging
        self.node = socket.gethostname().split(".")[0]
        self.dir = None
        self.procs = {}  # daemon name -> Popen

    # ---- life -------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self, timeout=60):
        why = missing()
        if why:
            raise SlurmError(why)
        t0 = time.monotonic()
        self.dir = Path(tempfile.mkdtemp(prefix="mix-slurm-"))
        os.chmod(self.dir, 0o755)  # job steps of other users would need to read slurm.conf
        self.conf = self.dir / "slurm.conf"
        try:
            self._start_munge()
            self._write_conf()
            self._spawn("slurmctld", [DAEMONS["slurmctld"], "-D", "-c", "-f", str(self.conf)])
            self._wait_for(lambda: self._ok(["scontrol", "ping"], "UP"), timeout, "slurmctld to answer")
            self._spawn("slurmd", [DAEMONS["slurmd"], "-D", "-N", self.node, "-f", str(self.conf)])
            self._wait_for(self._node_idle, timeout, f"node {self.node} to be idle")
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0

    def stop(self, grace=5):
        """Stops every daemon this object started, by pid, in reverse order
        (slurmd before slurmctld before munged); KILL after `grace` seconds."""
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(grace)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        # Job steps that outlived slurmd (slurmstepd runs apart from it) would keep ports and files.
        for pid in self._stepd_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.procs.clear()
        if self.dir and not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---- use --------------------------------------------------------------
    @property
    def env(self):
        """The environment for the Slurm clients: this cluster's slurm.conf."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        # A test run inside a real Slurm job must not hand that job's step to ours.
        for k in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
            if k != "SLURM_CONF":
                del env[k]
        return env

    def run(self, cmd, timeout=120, env=None, input=None):
        """Runs a client command (srun, sbatch, ...) with this cluster's slurm.conf;
        a timeout kills its process group. Returns (returncode, stdout, stderr, seconds)."""
        full = self.env
        full.update(env or {})
        t0 = time.monotonic()
        p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             errors="replace", env=full, start_new_session=True,
                             stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL)
        try:
            out, err = p.communicate(input=input, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            err += f"\n(killed after {timeout} s)"
            return 124, out, err, time.monotonic() - t0
        return p.returncode, out, err, time.monotonic() - t0

    def sbatch(self, script, args=(), env=None):
        """Submits `script` (its text); returns the job id. Its output goes to
        job_output(id) unless args say otherwise."""
        path = self.dir / f"job-{time.monotonic_ns()}.sh"
        path.write_text(script)
        path.chmod(0o755)
        cmd = ["sbatch", "--parsable", "--chdir", str(self.dir), "--output", str(self.dir / "slurm-%j.out"),
               *args, str(path)]
        rc, out, err, _ = self.run(cmd, timeout=30, env=env)
        if rc != 0:
            raise SlurmError(f"sbatch failed (exit {rc}): {err.strip()}")
        return int(out.strip().split(";")[0])

    def job_output(self, job):
        path = self.dir / f"slurm-{job}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def job_info(self, job):
        """scontrol's key=value fields of the job (empty once slurmctld forgot it)."""
        rc, out, _, _ = self.run(["scontrol", "-o", "show", "job", str(job)], timeout=15)
        if rc != 0:
            return {}
        fields = {}
        for word in out.split():
            key, eq, value = word.partition("=")
            if eq:
                fields[key] = value
        return fields

    def wait_job(self, job, timeout=180, poll=0.5):
        """Waits for the job to end; returns its scontrol fields (JobState, ExitCode...)."""
        deadline = time.monotonic() + timeout
        ended = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                 "BOOT_FAIL", "DEADLINE"}
        info = {}
        while time.monotonic() < deadline:
            info = self.job_info(job)
            if info.get("JobState") in ended:
                return info
            time.sleep(poll)
        self.run(["scancel", "--full", str(job)], timeout=15)
        raise SlurmError(f"job {job} did not end within {timeout} s (state {info.get('JobState')})")

    def log(self, daemon, tail=3000):
        path = self.dir / f"{daemon}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def mpi_plugins(self):
        """The MPI plugin types srun offers (srun --mpi=list): e.g. {'none', 'pmi2', 'pmix'}."""
        rc, out, err, _ = self.run(["srun", "--mpi=list"], timeout=15)
        # The plugin names are the indented lines, under a heading line.
        return {line.strip() for line in (out + err).splitlines() if line[:1].isspace() and line.strip()}

    # ---- inside -----------------------------------------------------------
    def _spawn(self, name, cmd):
        log = open(self.dir / f"{name}.stdout", "w")
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.env, start_new_session=True)
        log.close()

    def _start_munge(self):
        mdir = self.dir / "munge"
        mdir.mkdir(mode=0o700)
        key = mdir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = mdir / "munge.socket"
        # --force: munged otherwise refuses a key or socket folder owned by root, as here.
        self._spawn("munged", [DAEMONS["munged"], "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={mdir / 'munged.pid'}",
                               f"--log-file={mdir / 'munged.log'}", f"--seed-file={mdir / 'munged.seed'}"])
        self._wait_for(lambda: self.munge_socket.exists(), 20, "munged's socket")

    def _write_conf(self):
        d = self.dir
        for sub in ("state", "spool"):
            (d / sub).mkdir()
        self.ctld_port, self.slurmd_port = _free_port(), _free_port()
        lines = [
            "ClusterName=mixtest",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # No cgroups in a container without systemd: track by /proc, bind nothing.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "ReturnToService=2",
            f"KillWait={self.kill_wait}",
            # The node's CPUs as configured here, whatever the hardware reports.
            "SlurmdParameters=config_overrides",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO",
            *self.extra_conf,
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _ok(self, cmd, needle):
        rc, out, err, _ = self.run(cmd, timeout=10)
        return rc == 0 and needle in out

    def _node_idle(self):
        rc, out, _, _ = self.run(["sinfo", "-h", "-N", "-n", self.node, "-o", "%t"], timeout=10)
        return rc == 0 and out.strip() == "idle"

    def _wait_for(self, ready, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise SlurmError(f"{name} exited ({p.returncode}) while waiting for {what}:\n"
                                     f"{self._daemon_output(name)}")
            if ready():
                return
            time.sleep(0.3)
        raise SlurmError(f"timed out after {timeout} s waiting for {what}:\n"
                         f"slurmctld: {self.log('slurmctld', 1500)}\nslurmd: {self.log('slurmd', 1500)}")

    def _daemon_output(self, name):
        out = ""
        for suffix in (".stdout", ".log"):
            path = self.dir / f"{name}{suffix}"
            if path.exists():
                out += path.read_text(errors="replace")[-2000:]
        return out

    def _stepd_pids(self):
        """Pids of slurmstepd processes whose command line names this cluster's folder."""
        pids = []
        if not self.dir:
            return pids
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if b"slurmstepd" in cmdline.split(b"\0")[0] and str(self.conf).encode() in environ:
                pids.append(int(entry.name))
        return pids
