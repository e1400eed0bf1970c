"""Several hosts, for real: mixrun --hosts over network namespaces.

Three "hosts" are built on this machine from network namespaces, each plugged
into one bridge by a veth pair, with an address of its own on a private subnet
and a host name of its own (a UTS namespace entered with it):

    head    runs mixrun and mpirun, and no rank (a login node)
    hostA   ranks, started by an orted
    hostB   ranks, started by an orted

mpirun reaches hostA and hostB through tests/cluster/netns_agent.sh, a launch
agent that enters the namespace where ssh would log in (OMPI_MCA_plm_rsh_agent),
and MPI's TCP traffic (btl_tcp and the runtime's oob_tcp) is kept to the
bridge's subnet: each host also has a second network that leads nowhere,
which Open MPI would otherwise try. Host names resolve through
/etc/netns/<ns>/hosts, which `ip netns exec` shows as /etc/hosts inside each
namespace.

Checks:
  1. the rank table mixtrain logs at start puts ranks 0, 1 on hostA and 2, 3 on hostB;
  2. local ranks restart at 0 on each host (the shared-memory split of MPI_COMM_WORLD);
  3. the bytes hostA and hostB received through their veths cover the gradient
     bytes the metrics report: the gradients crossed the bridge over TCP (and
     with every rank on hostA, hostA's veth carries next to nothing);
  4. 2 hosts x 2 ranks end with the same parameters, bit for bit, as 1 host x 4 ranks;
  5. killing every process of hostB (its orted and ranks) ends the job within
     60 s, and the output says which ranks were lost.

Needs root, iproute2 and unshare; skips (77) with the reason otherwise. Every
namespace, link and hosts file is removed at the end, and leftovers of a run
that was killed before it could clean up are removed at the start.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
import mixtest  # noqa: E402  (tests/e2e, found through the path above)

AGENT = Path(__file__).resolve().parent / "netns_agent.sh"
MIXRUN = mixtest.BUILD_DIR / "mixrun"
# Every name this test creates starts with PREFIX and the pid of the test that
# created it, so a later run can tell its own from a dead run's leftovers.
# Interface names must fit in the kernel's IFNAMSIZ, hence the short prefix.
PREFIX = "mxh"
TAG = f"{PREFIX}{os.getpid()}"
# The subnet lives only inside the namespaces (the bridge in the root namespace
# has no address), so it cannot clash with this machine's networks or with a
# concurrent run of this test, whose namespaces are on a bridge of their own.
SUBNET = "10.213.7"
DECOY_SUBNET = "10.213.8"
HOSTS = ["head", "hostA", "hostB"]
RANK_LINE = re.compile(r"rank (\d+) -> (\S+) local (\d+) (\S+)")
KILL_DEADLINE_S = 60


def ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def run_of_this_test_alive(pid):
    """Whether pid is a live run of this test: not a zombie (a killed run whose
    parent has not reaped it yet), nor another program that got the pid later."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return Path(__file__).name.encode() in f.read()
    except (OSError, IndexError):
        return False


def ns_pids(ns):
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout
    return [int(p) for p in out.split()]


def kill_namespace_processes(ns, rounds=20):
    """SIGKILLs every process in namespace ns until none is left (a dying orted may
    still fork); returns the pids it killed."""
    killed = []
    for _ in range(rounds):
        pids = ns_pids(ns)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    return killed


def rank_of(pid):
    """OMPI_COMM_WORLD_RANK of a process (an MPI rank), or None (an orted, a shell)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for entry in f.read().split(b"\0"):
                if entry.startswith(b"OMPI_COMM_WORLD_RANK="):
                    return int(entry.split(b"=", 1)[1])
    except (OSError, ValueError):
        pass
    return None


def remove_stale():
    """Removes namespaces, links and hosts files of runs of this test whose process
    is gone (killed before its cleanup ran), and any that carry this run's own
    pid (then they too are a dead run's)."""
    def stale(name):
        m = re.match(rf"{PREFIX}(\d+)", name)
        return bool(m) and (int(m.group(1)) == os.getpid() or not run_of_this_test_alive(int(m.group(1))))

    removed = []
    for line in ip("netns", "list").splitlines():
        ns = line.split()[0] if line.split() else ""
        if stale(ns):
            kill_namespace_processes(ns)
            ip("netns", "del", ns, check=False)
            removed.append(ns)
    for line in ip("-o", "link", "show").splitlines():
        m = re.match(r"\d+: ([^:@]+)", line)
        if m and stale(m.group(1)):
            ip("link", "del", m.group(1), check=False)
            removed.append(m.group(1))
    netns_etc = Path("/etc/netns")
    if netns_etc.is_dir():
        for d in netns_etc.iterdir():
            if stale(d.name):
                shutil.rmtree(d, ignore_errors=True)
    if removed:
        print(f"removed leftovers of an earlier run: {', '.join(removed)}")


class Cluster:
    """The namespaces, the bridge and the hosts files of one run."""

    def __init__(self, hosts, session_dir):
        self.hosts = hosts
        # Open MPI's session directories and its shared-memory segments (some
        # MB a host), in the test's work folder, not in /tmp and /dev/shm: the
        # host-loss check kills hostB's orted and ranks before they can remove
        # their own.
        self.session_dir = session_dir
        self.bridge = f"{TAG}br"
        self.ns = {h: f"{TAG}-{h}" for h in hosts}
        self.addr = {h: f"{SUBNET}.{i + 1}" for i, h in enumerate(hosts)}
        # The root-namespace end of each host's veth: its counters see every
        # byte the host sends (rx) and receives (tx) over the bridge.
        self.veth = {h: f"{TAG}v{i}" for i, h in enumerate(hosts)}

    def create(self):
        ip("link", "add", self.bridge, "type", "bridge")
        ip("link", "set", self.bridge, "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{self.addr[h]} {h}\n" for h in self.hosts)
        for i, h in enumerate(self.hosts):
            ns, inner = self.ns[h], f"{TAG}e{i}"
            ip("netns", "add", ns)
            ip("link", "add", self.veth[h], "type", "veth", "peer", "name", inner)
            ip("link", "set", inner, "netns", ns)
            ip("link", "set", self.veth[h], "master", self.bridge)
            ip("link", "set", self.veth[h], "up")
            ip("-n", ns, "addr", "add", f"{self.addr[h]}/24", "dev", inner)
            ip("-n", ns, "link", "set", inner, "up")
            ip("-n", ns, "link", "set", "lo", "up")
            # A second network on every host that goes nowhere (a veth whose
            # peer is in the same namespace), as a docker bridge or a VPN would
            # be on a real host: Open MPI's TCP transport, left to itself,
            # tries it and the job hangs, so the run needs the
            # *_tcp_if_include settings a multi-host user must give.
            ip("-n", ns, "link", "add", "decoy0", "type", "veth", "peer", "name", "decoy1")
            ip("-n", ns, "addr", "add", f"{DECOY_SUBNET}.{i + 1}/24", "dev", "decoy0")
            ip("-n", ns, "link", "set", "decoy0", "up")
            ip("-n", ns, "link", "set", "decoy1", "up")
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)

    def destroy(self):
        for h in self.hosts:
            kill_namespace_processes(self.ns[h])
            ip("netns", "del", self.ns[h], check=False)
            shutil.rmtree(Path("/etc/netns") / self.ns[h], ignore_errors=True)
        for link in [*self.veth.values(), self.bridge]:
            ip("link", "del", link, check=False)

    def counters(self, host):
        """(rx_bytes, tx_bytes) of the host's veth end in the root namespace."""
        stats = Path("/sys/class/net") / self.veth[host] / "statistics"
        return int((stats / "rx_bytes").read_text()), int((stats / "tx_bytes").read_text())

    def in_host(self, host, argv):
        """argv run in host's namespace under its host name, as the agent runs the orted."""
        return ["ip", "netns", "exec", self.ns[host], "unshare", "--uts", "--",
                "sh", "-c", 'hostname "$0" && exec "$@"', host, *map(str, argv)]

    def mpi_env(self):
        return {
            "OMPI_MCA_plm_rsh_agent": str(AGENT),
            # The agent finds a host's namespace in NETNS_AGENT_HOSTS, which only
            # mpirun's environment has: the orteds must not launch each other.
            "OMPI_MCA_plm_rsh_no_tree_spawn": "1",
            "OMPI_MCA_btl_tcp_if_include": f"{SUBNET}.0/24",
            "OMPI_MCA_oob_tcp_if_include": f"{SUBNET}.0/24",
            "OMPI_MCA_orte_tmpdir_base": str(self.session_dir),
            "OMPI_MCA_btl_vader_backing_directory": str(self.session_dir),
            "NETNS_AGENT_HOSTS": " ".join(f"{h}={self.ns[h]}" for h in self.hosts if h != "head"),
        }


def require_namespaces():
    if os.geteuid() != 0:
        mixtest.skip("network namespaces need root")
    for tool in ("ip", "unshare", "hostname"):
        if not shutil.which(tool):
            mixtest.skip(f"no {tool} (iproute2, util-linux and hostname make the namespaces)")
    probe = subprocess.run(["unshare", "--uts", "--net", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        mixtest.skip(f"unshare --uts --net fails here: {probe.stderr.strip()}")
    if not os.access(MIXRUN, os.X_OK):
        print(f"FAIL: {MIXRUN} is not built (cmake --build {mixtest.BUILD_DIR} --target mixrun)")
        sys.exit(1)


def train_args(steps, out=None):
    args = ["--model", "mlp", "--data", "synthetic", "--synthetic-size", 1024, "--batch-size", 16,
            "--steps", steps, "--eval", "false", "--log-every", 5]
    if out:
        args += ["--metrics", out / "metrics.jsonl", "--save", out / "final.safetensors"]
    return args


def rank_table(output):
    """{rank: (host, local rank)} from the table rank 0 logs at start."""
    return {int(m.group(1)): (m.group(2), int(m.group(3))) for m in RANK_LINE.finditer(output)}


def mixrun_cmd(cluster, hosts, ranks, args):
    return cluster.in_host("head", [MIXRUN, "--hosts", hosts, "-n", ranks, "--", mixtest.MIXTRAIN, *args])


def check_two_hosts(checks, cluster, out):
    """Checks 1-3 on one run of 2 hosts x 2 ranks; returns its checkpoint, or None."""
    before = {h: cluster.counters(h) for h in ("hostA", "hostB")}
    run = mixtest.launch(mixrun_cmd(cluster, "hostA:2,hostB:2", 4, train_args(20, out)), 120, cluster.mpi_env())
    after = {h: cluster.counters(h) for h in ("hostA", "hostB")}
    print(f"2 hosts x 2 ranks: {run.seconds:.1f} s")
    if not checks.ok_run(run, "2 hosts x 2 ranks"):
        return None

    table = rank_table(run.out)
    hosts = {r: h for r, (h, _) in table.items()}
    checks.check(hosts == {0: "hostA", 1: "hostA", 2: "hostB", 3: "hostB"},
                 "the rank table puts ranks 0, 1 on hostA and 2, 3 on hostB", str(hosts))
    local = {r: lr for r, (_, lr) in table.items()}
    checks.check(local == {0: 0, 1: 1, 2: 0, 3: 1}, "local ranks restart at 0 on each host", str(local))

    metrics = mixtest.Metrics(out / "metrics.jsonl")
    grad = sum(s["grad_bytes"] for s in metrics.steps)
    # Each host ends every step with the sum of the other host's gradients, so
    # whatever the all-reduce's algorithm, at least grad_bytes per step must
    # reach it from the other side of the bridge (MPI does not compress). The
    # veth's tx counts what the bridge delivered into the host's namespace.
    for h in ("hostA", "hostB"):
        received = after[h][1] - before[h][1]
        sent = after[h][0] - before[h][0]
        checks.check(len(metrics.steps) == 20 and grad > 0 and received >= grad,
                     f"{h} received at least the gradient bytes over the bridge",
                     f"{received} B in, {sent} B out; {len(metrics.steps)} steps, {grad} gradient B")
    return out / "final.safetensors"


def check_one_host(checks, cluster, out, two_host_checkpoint):
    before = cluster.counters("hostA")
    run = mixtest.launch(mixrun_cmd(cluster, "hostA:4", 4, train_args(20, out)), 120, cluster.mpi_env())
    after = cluster.counters("hostA")
    print(f"1 host x 4 ranks: {run.seconds:.1f} s")
    if not checks.ok_run(run, "1 host x 4 ranks") or two_host_checkpoint is None:
        return
    local = {r: lr for r, (_, lr) in rank_table(run.out).items()}
    checks.check(local == {0: 0, 1: 1, 2: 2, 3: 3}, "one host: local ranks 0 to 3", str(local))
    # The control of the byte count above: with every rank on hostA, its veth
    # carries only the launch and the runtime's messages from head, far less
    # than the gradients, so that count measured the gradients' path.
    grad = sum(s["grad_bytes"] for s in mixtest.Metrics(out / "metrics.jsonl").steps)
    received = after[1] - before[1]
    checks.check(received < grad / 4, "one host: its veth carries no gradients",
                 f"{received} B in; {grad} gradient B")
    # Bit for bit: the all-reduce's algorithm and its order of additions depend
    # on the number of ranks and the message size, not on which transport (TCP
    # or shared memory) carries each message, and the data shards depend only on
    # the world rank.
    two, _ = mixtest.load_checkpoint(two_host_checkpoint)
    one, _ = mixtest.load_checkpoint(out / "final.safetensors")
    differ = sorted(k for k in set(two) | set(one)
                    if k not in two or k not in one or not mixtest.bit_identical(two[k], one[k]))
    checks.check(bool(two) and not differ, "2 hosts x 2 ranks end bit-identical to 1 host x 4 ranks",
                 f"{len(two)} tensors" + (f"; differ: {', '.join(differ)}" if differ else ""))


def check_host_loss(checks, cluster, out):
    """Kills every process of hostB mid-training: the job must end, and say which ranks it lost."""
    log_path = out / "job.log"
    metrics_path = out / "metrics.jsonl"
    env = dict(os.environ)
    env.update(mixtest.THREAD_ENV)
    env.update(cluster.mpi_env())
    cmd = mixrun_cmd(cluster, "hostA:2,hostB:2", 4, [*train_args(1000000), "--metrics", metrics_path])
    with open(log_path, "w") as log:
        job = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        # Training: rank 0 has written a few steps' metrics.
        deadline = time.monotonic() + 60
        training = False
        while time.monotonic() < deadline and job.poll() is None and not training:
            time.sleep(0.5)
            training = metrics_path.exists() and len(metrics_path.read_text().splitlines()) >= 3
        if not checks.check(training, "host loss: the job is training before the kill"):
            print(log_path.read_text()[-3000:])
            return
        victims = ns_pids(cluster.ns["hostB"])
        killed_ranks = sorted(r for r in map(rank_of, victims) if r is not None)
        t0 = time.monotonic()
        kill_namespace_processes(cluster.ns["hostB"])
        try:
            job.wait(timeout=KILL_DEADLINE_S)
        except subprocess.TimeoutExpired:
            pass
        secs = time.monotonic() - t0
        ended = job.poll() is not None
        checks.check(ended, f"the job ended within {KILL_DEADLINE_S} s of hostB's loss", f"{secs:.1f} s")
        checks.check(ended and job.returncode != 0, "with a non-zero status", str(job.returncode))
        time.sleep(1.0)
        left = {h: ns_pids(cluster.ns[h]) for h in ("head", "hostA")}
        checks.check(not any(left.values()), "nothing is left running on head and hostA", str(left))

        output = log_path.read_text(errors="replace")  # a file: mixtrain logs without colours
        # Open MPI names the lost daemon's node, not the ranks it ran.
        lost_nodes = re.findall(r"Remote daemon:\s*\S+ on node (\S+)", output)
        checks.check(lost_nodes == ["hostB"], "Open MPI's output names hostB as the lost node", str(lost_nodes))
        # The "ranks by host" line rank 0 logs at start maps that node to its ranks.
        by_host = re.search(r"ranks by host: (.*)", output)
        named = []
        for entry in (by_host.group(1).split("; ") if by_host else []):
            host, _, ranks = entry.partition(": rank(s) ")
            if host in lost_nodes:
                named += sorted(int(r) for r in ranks.split(", "))
        checks.check(killed_ranks == [2, 3] and named == killed_ranks,
                     "the output names the lost ranks (Open MPI's node, and mixtrain's ranks-by-host line)",
                     f"lost ranks {named} on {lost_nodes}; killed ranks {killed_ranks}")
        print("     > " + "\n     > ".join(l for l in output.splitlines() if "node" in l or "host:" in l))
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def main():
    require_namespaces()
    mixtest.require_mixtrain()
    mixtest.require_mpirun()
    checks = mixtest.Checks("several_hosts")
    work = mixtest.workdir("several_hosts")
    remove_stale()
    cluster = Cluster(HOSTS, work / "ompi")
    try:
        t0 = time.monotonic()
        try:
            cluster.create()
        except RuntimeError as e:
            mixtest.skip(f"cannot build the namespaces: {e}")
        print(f"namespaces {', '.join(cluster.ns.values())} on bridge {cluster.bridge}: "
              f"{time.monotonic() - t0:.1f} s")
        for name in ("two", "one", "loss", "ompi"):
            (work / name).mkdir()
        checkpoint = check_two_hosts(checks, cluster, work / "two")
        check_one_host(checks, cluster, work / "one", checkpoint)
        t0 = time.monotonic()
        check_host_loss(checks, cluster, work / "loss")
        print(f"host loss: {time.monotonic() - t0:.1f} s")
        # hostB's orted and ranks, killed above, could not remove their session
        # directory and shared memory: they must be in the work folder, which
        # goes at exit, not in /tmp and /dev/shm.
        in_work = sorted(d.name for d in (work / "ompi").iterdir())
        checks.check(any(name.startswith("ompi.hostB.") for name in in_work)
                     and any(name.startswith("vader_segment.hostB.") for name in in_work),
                     "Open MPI's session directories and shared memory, killed hostB's included, are in the work "
                     "folder", ", ".join(in_work) or "none")
    finally:
        t0 = time.monotonic()
        cluster.destroy()
        print(f"cleanup: {time.monotonic() - t0:.1f} s")
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
