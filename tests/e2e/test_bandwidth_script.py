#!/usr/bin/python3
"""scripts/bandwidth.sh end to end, at toy sizes: 2 ranks, all-reduces up to 64 KB,
the MLP's gradient sync. It must write allreduce.csv (half and float rows, all
checked with 0 wrong) and grad_sync.csv (FP16 and FP32 rows, FP16 exactly half
the bytes), print the FP16/FP32 ratio tables, and render both PNGs when
matplotlib is installed (scripts/setup.sh installs it).
"""
import csv
import sys

import mixtest as mt


def main():
    mt.require_mpirun()
    c = mt.Checks("bandwidth_script")
    d = mt.workdir("bandwidth_script")
    script = mt.SOURCE_DIR / "scripts" / "bandwidth.sh"
    # Bad arguments stop it before the sweep (which takes minutes at the defaults), naming the argument.
    for args, says in ((["-n"], "-n needs a value"), (["--max-bytes", "512"], "below 1K"),
                       (["--models", "mlp bogus"], "unknown model 'bogus'"), (["--iters", "0"], "--iters")):
        bad = mt.launch(["bash", script, "--out", d / "bad", *args], timeout=30,
                        env={"MIX_BUILD_DIR": str(mt.BUILD_DIR)})
        c.check(bad.rc == 2 and says in bad.stderr and not (d / "bad").exists(),
                f"bandwidth.sh {' '.join(args)}: exit 2 saying '{says}', nothing run", bad.describe(400))
    r = mt.launch(["bash", script, "-n", 2, "--max-bytes", "64K", "--models", "mlp",
                   "--iters", 2, "--out", d], timeout=300, env={"MIX_BUILD_DIR": str(mt.BUILD_DIR)})
    if not c.ok_run(r, "scripts/bandwidth.sh -n 2 --max-bytes 64K --models mlp"):
        c.finish()
    ar = list(csv.DictReader(open(d / "allreduce.csv")))
    c.check({x["type"] for x in ar} == {"half", "float"} and len(ar) == 2 * 7, "all-reduce rows: 1K..64K x half, float",
            f"{len(ar)} rows")
    c.check(all(x["wrong"] == "0" and x["wrong_ip"] == "0" for x in ar), "every all-reduce row checked, 0 wrong")
    gs = list(csv.DictReader(open(d / "grad_sync.csv")))
    c.check([x["grad_reduce"] for x in gs] == ["fp16", "fp32"], "grad-sync rows: FP16 then FP32",
            f"{[x['grad_reduce'] for x in gs]}")
    if len(gs) == 2:
        c.check(2 * int(gs[0]["bytes"]) == int(gs[1]["bytes"]), "the MLP's FP16 sync moves half the bytes")
    c.check("FP16/FP32" in r.stdout and "time ratio" in r.stdout, "the ratio tables are printed", r.stdout[-500:])
    try:
        import matplotlib  # noqa: F401
        have_mpl = True
    except ImportError:
        have_mpl = False
    if have_mpl:
        for png in ("allreduce_busbw.png", "grad_sync.png"):
            p = d / png
            c.check(p.exists() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is a PNG")
    else:
        print("NOTE: no matplotlib for /usr/bin/python3: plots not checked")
    c.finish()


if __name__ == "__main__":
    sys.exit(main())
