"""Resume is exact: 10 steps in one run equal 6 steps, --save, then --resume to
step 10, bit for bit (parameters, optimizer state and the scaler's metadata),
for AMP with momentum and for AdamW, on 1 rank and on 2 ranks."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.environ.get("MIX_SOURCE_DIR", os.path.dirname(__file__) + "/../.."), "tests", "python"))
import safetensors_io  # noqa: E402

BUILD = os.environ.get("MIX_BUILD_DIR", os.path.join(os.path.dirname(__file__), "../../build"))
MPIRUN = os.environ.get("MIX_MPIRUN") or "mpirun"
MIXTRAIN = os.path.join(BUILD, "mixtrain")


def run(ranks, args, tmp):
    cmd = [MIXTRAIN, "--data", "synthetic", "--synthetic-size", "1024", "--synthetic-features", "32",
           "--hidden", "16", "--batch-size", "32", "--eval", "false", "--lr", "0.05"] + args
    if ranks > 1:
        cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-x", "OPENBLAS_NUM_THREADS=1",
               "-np", str(ranks)] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit(f"mixtrain failed: {' '.join(cmd)}")


def main():
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in (1, 2):
            for opt in (["--optimizer", "momentum"], ["--optimizer", "adamw", "--lr", "0.002"]):
                # A small incr interval makes the scaler's counters move during the run.
                common = opt + ["--precision", "amp", "--incr-every-n-steps", "4"]
                full, part, resumed = (os.path.join(tmp, n) for n in ("full.st", "part.st", "resumed.st"))
                run(ranks, common + ["--steps", "10", "--save", full], tmp)
                run(ranks, common + ["--steps", "6", "--save", part], tmp)
                run(ranks, common + ["--steps", "10", "--resume", part, "--save", resumed], tmp)
                a, meta_a = safetensors_io.load(full)
                b, meta_b = safetensors_io.load(resumed)
                label = f"{ranks} rank(s), {opt[1]}"
                if sorted(a) != sorted(b):
                    print(f"FAIL {label}: tensor names differ: {sorted(a)} vs {sorted(b)}")
                    failures += 1
                    continue
                bad = [k for k in a if a[k].tobytes() != b[k].tobytes()]
                for key in ("loss_scale", "scaler_good_steps", "scaler_bad_steps", "step"):
                    if meta_a.get(key) != meta_b.get(key):
                        bad.append(f"metadata {key}: {meta_a.get(key)} vs {meta_b.get(key)}")
                if bad:
                    print(f"FAIL {label}: differ after resume: {bad}")
                    failures += 1
                else:
                    print(f"ok   {label}: {len(a)} tensors bit-identical, scale {meta_a.get('loss_scale')}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
