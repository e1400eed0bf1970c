#!/usr/bin/python3
"""mixbench allreduce (launch/mixbench.cc, launch/allreduce_bench.cc):

  1. on 1 rank (local communicator), and on 2 and 4 ranks under mpirun, every size,
     dtype (half, bfloat16, float) and reduction (sum, max, avg) passes --check
     out of place and in place (rank r holds (r % 4 + 1)(i % 3 + 1): the results
     are known exactly), exit status 0;
  2. the CSV has one row per size x dtype x reduction with the columns the
     bandwidth scripts read; count x dtype size = size; algbw = size / time;
     busbw = algbw * 2(n-1)/n (0 on one rank);
  3. sizes run from -b to -e by -f; the printed table has the same rows;
  4. bad flags exit 2 naming the flag.
"""
import csv
import os
import sys

import mixtest as mt

MIXBENCH = mt.BUILD_DIR / "mixbench"
TYPES = ("half", "bfloat16", "float")
OPS = ("sum", "max", "avg")
SIZES = [1024 * 4 ** k for k in range(6)]  # 1K .. 1M by 4


def run(args, np=1, timeout=300):
    args = [str(a) for a in args]
    if np == 1:
        return mt.launch([MIXBENCH, *args], timeout)
    return mt.launch([mt.MPIRUN, *mt.mpirun_flags(), "-np", str(np), MIXBENCH, *args], timeout)


def main():
    if not os.access(MIXBENCH, os.X_OK):
        print(f"FAIL: {MIXBENCH} is not built")
        return 1
    c = mt.Checks("mixbench")
    d = mt.workdir("mixbench")
    worlds = [1]
    if mt.have_mpirun() and os.environ.get("MIX_WITH_MPI") != "OFF":
        worlds += [2, 4]
    else:
        print("NOTE: no mpirun in this build: only the single-rank run")
    for world in worlds:
        out = d / f"np{world}.csv"
        r = run(["allreduce", "-b", "1K", "-e", "1M", "-f", 4, "-d", ",".join(TYPES), "-o", ",".join(OPS), "-n", 3,
                 "-w", 1, "--check", "--csv", out], np=world)
        if not c.ok_run(r, f"{world} rank(s): allreduce --check over 3 dtypes x 3 reductions x 6 sizes"):
            continue
        c.check("Out of bounds values : 0 OK" in r.stdout, f"{world} rank(s): the table reports no wrong value",
                r.stdout[-300:])
        rows = list(csv.DictReader(open(out)))
        want = {(s, t, o) for s in SIZES for t in TYPES for o in OPS}
        got = {(int(x["size"]), x["type"], x["redop"]) for x in rows}
        c.check(got == want and len(rows) == len(want), f"{world} rank(s): one CSV row per size x dtype x reduction",
                f"{len(rows)} rows, missing {sorted(want - got)[:3]}")
        elem = {"half": 2, "bfloat16": 2, "float": 4}
        bad = [x for x in rows if int(x["count"]) * elem[x["type"]] != int(x["size"])]
        c.check(not bad, f"{world} rank(s): count x dtype size = size", f"{bad[:1]}")
        c.check(all(int(x["wrong"]) == 0 and int(x["wrong_ip"]) == 0 for x in rows),
                f"{world} rank(s): #wrong is 0 out of place and in place in every row")
        factor = 2 * (world - 1) / world
        off = [x for x in rows
               if abs(float(x["algbw"]) - int(x["size"]) / 1e9 / (float(x["time_us"]) * 1e-6)) > 1e-3 * float(x["algbw"])
               or abs(float(x["busbw"]) - factor * float(x["algbw"])) > 1e-3 * float(x["algbw"]) + 1e-12]
        c.check(not off, f"{world} rank(s): algbw = size / time and busbw = algbw x {factor:.3f}", f"{off[:1]}")
        table = [l for l in r.stdout.splitlines() if l.strip() and not l.lstrip().startswith("#")]
        c.check(len(table) == len(rows), f"{world} rank(s): the printed table has a line per row",
                f"{len(table)} lines")
        c.check(all(x["world"] == str(world) for x in rows), f"{world} rank(s): the CSV records the world size")

    for flags, name in ((["-d", "int8"], "--datatype"), (["-b", "1X"], "--minbytes"), (["-o", "prod"], "--op")):
        r = run(["allreduce", *flags])
        c.check(r.rc == 2 and name in r.stderr, f"allreduce {' '.join(flags)}: exit 2 naming {name}", r.describe(400))
    r = run(["allreduce", "-b", "1M", "-e", "1K"])
    c.check(r.rc == 2 and "larger than -e" in r.stderr, "-b larger than -e: exit 2 saying so", r.describe(400))
    c.finish()


if __name__ == "__main__":
    sys.exit(main())
