#!/usr/bin/python3
"""Every script in scripts/ (each .sh and .py file; scripts/lib/ is not listed)
answers --help and -h with exit 0 and a usage text on stdout whose first line
is `usage: scripts/NAME ...`, and does nothing else: no set-up (apt-get), no
build, no file written.

Each call runs, with a 20 s limit, in a fresh working directory, with
MIX_BUILD_DIR, MIX_RUN_DIR and TMPDIR inside a fresh folder and with stand-ins
for cmake, ctest, apt-get, sudo, dpkg-query, mpirun, ... first on PATH that
write down any call into that folder; afterwards both folders must still be
empty. The scripts are found by listing the folder, so a new script without
--help fails here. The scripts that parse their own flags must also refuse an
unknown one with exit 2, naming it and pointing to --help. gpu_check.sh's
--focus: its help, a bad value refused, and what --list-rows says each focus
runs (issue 41's rows for compare, in its order; more for all).
"""
import os
import sys

import mixtest as mt

SCRIPTS = mt.SOURCE_DIR.resolve() / "scripts"
# A call of any of these would mean the script did more than print its usage.
WATCHED = ("cmake", "ctest", "make", "ninja", "apt-get", "sudo", "dpkg", "dpkg-query", "mpirun", "nvidia-smi",
           "nvcc", "git")
# The scripts that parse all their arguments themselves (no pass-through), refusing unknown flags.
PARSERS = ("bandwidth.sh", "bench_data.sh", "bench_memory.sh", "bench_overlap.sh", "bench_vs_pytorch.sh", "convergence.sh",
           "fuzz.sh", "gpu_check.sh", "torch_compare.py")


def stand_ins(base):
    """A folder of commands that note their call in $MIX_HELP_CALLS and fail."""
    d = base / "stand_ins"
    d.mkdir()
    for name in WATCHED:
        f = d / name
        f.write_text('#!/bin/sh\necho "$(basename "$0") $*" >>"$MIX_HELP_CALLS"\nexit 1\n')
        f.chmod(0o755)
    return d


def run(base, bin_dir, label, args):
    """Runs scripts/ARGS[0] ARGS[1:] in fresh folders: (result, what the folders hold afterwards)."""
    d = base / label
    work, scratch = d / "work", d / "scratch"
    work.mkdir(parents=True)
    scratch.mkdir()
    env = {"MIX_BUILD_DIR": str(scratch / "build"), "MIX_RUN_DIR": str(scratch / "run"), "TMPDIR": str(scratch),
           "MIX_HELP_CALLS": str(scratch / "calls.log"), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    here = os.getcwd()
    os.chdir(work)
    try:
        r = mt.launch([SCRIPTS / args[0], *args[1:]], timeout=20, env=env)
    finally:
        os.chdir(here)
    left = sorted(str(p.relative_to(d)) for p in d.rglob("*") if p not in (work, scratch))
    calls = (scratch / "calls.log").read_text().strip() if (scratch / "calls.log").exists() else ""
    return r, left, calls


# What gpu_check.sh --focus compare must run (issue 41): mixtrain's rows that have a PyTorch twin,
# before torch_compare; then the attention variants, GPT-2's profile, and last memcheck of the fused
# attention, which gets only the time left.
COMPARE_TWINS = ("resnet50_amp", "resnet50_fp32", "resnet50_amp_b256", "resnet50_fp32_b256", "transformer_amp",
                 "transformer_fp32", "gpt2_amp", "gpt2_fp32")
COMPARE_AFTER = ("torch_compare", "transformer_amp_unfused", "gpt2_amp_unfused", "gpt2_amp_own_attention",
                 "gpt2_amp_fp32_attention", "gpt2_amp_profile", "memcheck_test_cuda_fused_attention")


def check_gpu_check_focus(c, base, bin_dir):
    """gpu_check.sh's --focus: in its help, a bad value refused, and --list-rows's runs for each focus."""
    r, _, _ = run(base, bin_dir, "gpu_check-focus-help", ["gpu_check.sh", "--help"])
    ok = "--focus compare" in r.stdout and "--list-rows" in r.stdout
    c.check(ok, "scripts/gpu_check.sh --help: describes --focus and --list-rows, with the command for a short lend",
            "" if ok else r.stdout[:400])
    r, left, calls = run(base, bin_dir, "gpu_check-focus-bad", ["gpu_check.sh", "--focus", "x"])
    ok = r.rc == 2 and "'x'" in r.stderr and "compare" in r.stderr and "all" in r.stderr and not left and not calls
    c.check(ok, "scripts/gpu_check.sh --focus x: exit 2 naming the value and the allowed ones, nothing done",
            r.stderr.strip() if ok else r.describe(400))
    listed = {}
    for focus in ("compare", "all"):
        r, left, calls = run(base, bin_dir, f"gpu_check-list-{focus}", ["gpu_check.sh", "--focus", focus, "--list-rows"])
        listed[focus] = r.stdout.split()
        ok = r.rc == 0 and bool(listed[focus]) and not left and not calls
        c.check(ok, f"scripts/gpu_check.sh --focus {focus} --list-rows: exit 0, the runs listed, nothing done",
                f"{len(listed[focus])} runs" if ok else r.describe(400) + "; ".join(left[:5] + [calls[:300]]))
    rows = listed["compare"]
    missing = [n for n in ("build", "cuda_tests") + COMPARE_TWINS + COMPARE_AFTER if n not in rows]
    c.check(not missing, "--focus compare lists the build, the [cuda] tests and issue 41's rows",
            f"missing {missing} from {rows}")
    if not missing:
        order = [rows.index(n) for n in COMPARE_AFTER]
        c.check(max(rows.index(n) for n in COMPARE_TWINS) < order[0] and order == sorted(order),
                "--focus compare runs the twins, then torch_compare, the attention variants, memcheck, the profile",
                " ".join(rows))
    c.check(set(rows) < set(listed["all"]), "--focus all lists every run of --focus compare and more",
            f"compare {len(rows)}, all {len(listed['all'])}; only in compare: {sorted(set(rows) - set(listed['all']))}")
    r, _, _ = run(base, bin_dir, "gpu_check-list-default", ["gpu_check.sh", "--list-rows"])
    ok = r.stdout.split() == listed["all"]
    c.check(ok, "scripts/gpu_check.sh --list-rows: --focus all by default", "" if ok else r.describe(300))


def main():
    c = mt.Checks("script_help")
    base = mt.workdir("script_help")
    bin_dir = stand_ins(base)
    names = sorted(p.name for p in SCRIPTS.iterdir() if p.is_file() and p.suffix in (".sh", ".py"))
    c.check({"run.sh", "test.sh", "build.sh"} <= set(names), "scripts/ lists the scripts", " ".join(names))
    for name in names:
        if not c.check(os.access(SCRIPTS / name, os.X_OK), f"scripts/{name} is executable"):
            continue
        for flag in ("--help", "-h"):
            r, left, calls = run(base, bin_dir, f"{name}{flag}", [name, flag])
            first = r.stdout.splitlines()[0] if r.stdout else ""
            ok = (not r.timed_out and r.rc == 0 and first.split()[:2] == ["usage:", f"scripts/{name}"]
                  and len(r.stdout.splitlines()) >= 2)
            c.check(ok, f"scripts/{name} {flag}: exit 0, usage: scripts/{name} and what it does on stdout",
                    "" if ok else r.describe(800))
            c.check(not left and not calls, f"scripts/{name} {flag}: nothing built, written or called",
                    "; ".join(left[:5] + ([calls[:300]] if calls else [])))
    for name in PARSERS:
        r, left, calls = run(base, bin_dir, f"{name}-bad", [name, "--no-such-flag"])
        ok = r.rc == 2 and "--no-such-flag" in r.stderr and "--help" in r.stderr and not left and not calls
        c.check(ok, f"scripts/{name} --no-such-flag: exit 2 naming it and --help, nothing done",
                r.stderr.strip() if ok else r.describe(400))
    check_gpu_check_focus(c, base, bin_dir)
    # A parser answers --help after other flags too.
    r, left, calls = run(base, bin_dir, "bandwidth.sh-late-help", ["bandwidth.sh", "-n", "2", "--help"])
    ok = r.rc == 0 and r.stdout.startswith("usage: scripts/bandwidth.sh") and not left and not calls
    c.check(ok, "scripts/bandwidth.sh -n 2 --help: the usage, nothing done", "" if ok else r.describe(400))
    c.finish()


if __name__ == "__main__":
    sys.exit(main())
