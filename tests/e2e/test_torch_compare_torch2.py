#!/usr/bin/python3
"""scripts/torch_compare.py on a PyTorch 2.x, on the CPU: the paths that the GPU
check's PyTorch (a 2.x) takes and Debian's python3-torch cannot reach.

The PyTorch is the one scripts/setup.sh --tests installs in its own virtual
environment ($MIX_TORCH2_DIR, default /opt/mixtrain-torch2; or the Python
$MIX_TORCH2_PYTHON names);
without it the test skips, saying so. On it:

- every row but torch.compile's, as test_torch_compare.py checks them, and the
  FP16 rows too: torch.amp.GradScaler on the CPU, its skipped steps and scale;
  AdamW fused where this torch fuses it on the CPU (2.4 on; nanoGPT fuses it
  on CUDA, which the GPU run takes); TF32 off as torch 2.9's per-op
  precisions read it back;
- the first two torch.compile rows the GPU check reaches (gpt2_amp_compile,
  gpt2_bf16_compile), each compiled for real by inductor in its child
  process: ok, with a rate, their warm-up (the compile) far longer than a step;
- a torchvision that fails on import: the written-out ResNet-50, saying why.
"""
import os

import mixtest as mt
import test_torch_compare as ttc

TORCH2_DIR = os.environ.get("MIX_TORCH2_DIR") or "/opt/mixtrain-torch2"  # scripts/setup.sh's default
PYTHON = os.environ.get("MIX_TORCH2_PYTHON") or f"{TORCH2_DIR}/bin/python"
# Each compile row's own limit, generous for a two-core machine that CTest shares with other
# tests; both rows and the rest stay within the test's CTest timeout (900 s, tests/CMakeLists.txt).
COMPILE_BUDGET_S = 180


def check_compile(c, python, work):
    rows = "gpt2_amp_compile,gpt2_bf16_compile"
    # An empty cache of inductor's own, so that the rows compile from scratch, as on a fresh GPU
    # machine, and not from what an earlier run of this test left in the user's cache.
    env = {"TORCHINDUCTOR_CACHE_DIR": str(work / "inductor_cache")}
    r = ttc.run(["--device", "cpu", "--smoke", "--steps", "2", "--warmup", "1", "--rows", rows,
                 "--compile-budget", str(COMPILE_BUDGET_S)], timeout=2 * COMPILE_BUDGET_S + 60, env=env,
                python=python)
    got = ttc.json_lines(r.stdout) if r.rc == 0 else []
    c.check([d["row"] for d in got] == rows.split(","), "torch.compile rows: one JSON line each",
            r.describe(1500) if not got else "")
    for d in got:
        # The warm-up step is where inductor compiles the forward and the backward: far longer than a
        # compiled step. An eager model (torch.compile left out) would warm up in about one step's time.
        compile_s, step_s = d.get("compile_s") or 0, (d.get("step_ms") or 0) / 1e3
        ok = (d["status"] == "ok" and d["error"] is None and d.get("tokens_per_s", 0) > 0 and step_s > 0
              and compile_s > 20 * step_s * max(1, d["warmup"]))
        c.check(ok, f"{d['row']}: compiled in its child process (warm-up {compile_s:.1f} s, a step "
                    f"{1e3 * step_s:.1f} ms), ok", "" if ok else str(d)[:600])


def main():
    c = mt.Checks("torch_compare_torch2")
    if not os.access(PYTHON, os.X_OK):
        mt.skip(f"no PyTorch 2.x at {PYTHON} (scripts/setup.sh --tests installs one; MIX_TORCH2_PYTHON names another)")
    facts = ttc.torch_facts(PYTHON)
    if facts is None:
        mt.skip(f"{PYTHON} cannot import torch")
    version = tuple(int(x) for x in facts["version"].split("+")[0].split(".")[:2])
    c.check(version >= (2, 0) and facts["compile"] and facts["amp_scaler"],
            f"torch {facts['version']}: torch.compile and torch.amp.GradScaler")
    work = mt.workdir("torch_compare_torch2")
    tc = mt.load_script(ttc.SCRIPT)
    rows = ttc.check_smoke(c, tc, work, python=PYTHON, facts=facts)
    want = {"matmul": "ieee", "conv": "ieee", "rnn": "ieee"}
    c.check(bool(rows) and all(d.get("fp32_precision") == want for d in rows),
            "TF32 off through torch 2.9's per-op precisions: matmul, conv and rnn ieee",
            str(rows[0].get("fp32_precision")) if rows else "")
    gpt = [d for d in rows if d["model"] != "resnet50"]
    if version >= (2, 4):
        c.check(gpt and all(d["optimizer"] == "AdamW(fused)" for d in gpt), "AdamW fused on the CPU (torch 2.4 on)",
                " ".join(d["optimizer"] for d in gpt))
    check_compile(c, PYTHON, work)
    ttc.check_broken_torchvision(c, work, python=PYTHON)
    c.finish()


if __name__ == "__main__":
    main()
