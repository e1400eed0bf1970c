#!/usr/bin/python3
"""scripts/torch_compare.py on a PyTorch 2.x, on the CPU: the paths that the GPU
check's PyTorch (a 2.x) takes and Debian's python3-torch cannot reach.

The PyTorch is the one scripts/setup.sh --tests installs in its own virtual
environment ($MIX_TORCH2_PYTHON, default /opt/mixtrain-torch2/bin/python);
without it the test skips, saying so. On it:

- every row but torch.compile's, as test_torch_compare.py checks them, and the
  FP16 rows too: torch.amp.GradScaler on the CPU, its skipped steps and scale;
  AdamW fused where this torch fuses it on the CPU (2.4 on), as nanoGPT asks;
  TF32 off as torch 2.9's per-op precisions read it back;
- the first two torch.compile rows the GPU check reaches (gpt2_amp_compile,
  gpt2_bf16_compile), each compiled for real by inductor in its child
  process: ok, with their compile time and a rate;
- a torchvision that fails on import: the written-out ResNet-50, saying why.
"""
import os

import mixtest as mt
import test_torch_compare as ttc

PYTHON = os.environ.get("MIX_TORCH2_PYTHON") or "/opt/mixtrain-torch2/bin/python"
# Inductor compiles GPT-2's smoke model and its backward in about half a minute on an idle
# two-core machine; CTest may run other tests beside it.
COMPILE_BUDGET_S = 300


def check_compile(c, python):
    rows = "gpt2_amp_compile,gpt2_bf16_compile"
    r = ttc.run(["--device", "cpu", "--smoke", "--steps", "2", "--warmup", "1", "--rows", rows,
                 "--compile-budget", str(COMPILE_BUDGET_S)], timeout=2 * COMPILE_BUDGET_S + 120, python=python)
    got = ttc.json_lines(r.stdout) if r.rc == 0 else []
    c.check([d["row"] for d in got] == rows.split(","), "torch.compile rows: one JSON line each",
            r.describe(1500) if not got else "")
    for d in got:
        ok = (d["status"] == "ok" and d["error"] is None and d.get("compile_s", 0) > 0
              and d.get("tokens_per_s", 0) > 0 and d["optimizer"].startswith("AdamW"))
        c.check(ok, f"{d['row']}: compiled by torch.compile in its child, ok, compile {d.get('compile_s')} s",
                "" if ok else str(d)[:600])


def main():
    c = mt.Checks("torch_compare_torch2")
    if not os.access(PYTHON, os.X_OK):
        mt.skip(f"no PyTorch 2.x at {PYTHON} (scripts/setup.sh --tests installs one; MIX_TORCH2_PYTHON names another)")
    facts = ttc.torch_facts(PYTHON)
    if facts is None:
        mt.skip(f"{PYTHON} cannot import torch")
    major = int(facts["version"].split(".")[0])
    c.check(major >= 2 and facts["compile"] and facts["amp_scaler"],
            f"torch {facts['version']}: torch.compile and torch.amp.GradScaler")
    work = mt.workdir("torch_compare_torch2")
    tc = mt.load_script(ttc.SCRIPT)
    rows = ttc.check_smoke(c, tc, work, python=PYTHON, facts=facts)
    version = tuple(int(x) for x in facts["version"].split("+")[0].split(".")[:2])
    gpt = [d for d in rows if d["model"] != "resnet50"]
    if version >= (2, 4):
        c.check(gpt and all(d["optimizer"] == "AdamW(fused)" for d in gpt), "AdamW fused on the CPU (torch 2.4 on)",
                " ".join(d["optimizer"] for d in gpt))
    check_compile(c, PYTHON)
    ttc.check_broken_torchvision(c, work, python=PYTHON)
    c.finish()


if __name__ == "__main__":
    main()
