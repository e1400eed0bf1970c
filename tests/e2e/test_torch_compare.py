#!/usr/bin/python3
"""scripts/torch_compare.py on the CPU (--device cpu --smoke: its models on tiny
shapes) and the GPU check's table that puts its rows beside mixtrain's
(scripts/lib/compare_summary.py):

- every row but the torch.compile ones: one well-formed JSON line each, on
  stdout and in --out alike; the FP32 and BF16 rows ok with positive rates,
  tokens/s = sequences/s x context, FLOPs per unit as scripts/lib/mfu.py counts
  them and MFU = rate x FLOPs / --peak-tflops; the FP16 GradScaler rows
  skipped as "cuda only" where the torch has no torch.amp.GradScaler (before
  2.3), else run on the CPU with their skipped steps and loss scale; the
  readable table names every row; exit 0;
- a torch.compile row through its child process, with the test's stand-in
  compile (MIX_TORCH_COMPARE_COMPILE_STUB: a sleep, for a torch without
  torch.compile): ok within --compile-budget, and skipped with the reason in
  about the budget's time when the compile takes longer; without the stand-in
  on a torch without torch.compile, skipped with that reason;
- --dry-run --gpu-name "NVIDIA H100 80GB HBM3": the full-size models' FLOPs
  (GPT-2 124M: 855,383,040 a token, nanoGPT's 6N + 12LHQT; ResNet-50
  24,535,105,536 an image) and the H100 SXM's 989.4 TFLOPS, no torch needed;
- a Python whose torch cannot be imported: every row skipped, saying so, exit 0;
- the written-out ResNet-50 has torchvision's names and shapes (when
  torchvision is importable);
- a torchvision that fails on import (built for another torch): the ResNet-50
  rows run the written-out network and say why; an error's reason is its
  message's last line (torch.compile's first names only the backend);
- TF32 off, read back through either API (the legacy flags, or torch 2.9's
  per-op precisions): a torch that keeps TF32 on for an op is refused, naming
  the op;
- the summary table: ratio mixtrain / PyTorch and both MFUs against
  hand-computed figures, the compile row beside mixtrain's row of the same
  base name, a missing mixtrain file and a skipped PyTorch row said as such,
  and both sides' skipped steps where either skipped any.

test_torch_compare_torch2.py runs the torch-dependent checks again on a
PyTorch 2.x (scripts/setup.sh --tests), with a real torch.compile.
"""
import json
import math
import sys

import mixtest as mt

SCRIPT = mt.SOURCE_DIR / "scripts" / "torch_compare.py"
SUMMARY = mt.SOURCE_DIR / "scripts" / "lib" / "compare_summary.py"
sys.path.insert(0, str(mt.SOURCE_DIR / "scripts" / "lib"))
import mfu  # noqa: E402


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def run(args, timeout=120, env=None, python=sys.executable):
    return mt.launch([python, SCRIPT, *args], timeout=timeout, env=env)


def torch_facts(python=sys.executable):
    """What the torch of `python` has, asked in a process of its own: version, compile, amp_scaler."""
    probe = ("import json, torch; print(json.dumps({'version': torch.__version__, 'compile': hasattr(torch, "
             "'compile'), 'amp_scaler': hasattr(getattr(torch, 'amp', None), 'GradScaler')}))")
    r = mt.launch([python, "-c", probe], timeout=120)
    return json.loads(r.stdout.strip().splitlines()[-1]) if r.rc == 0 and r.stdout.strip() else None


def check_smoke(c, tc, work, python=sys.executable, facts=None):
    """Every row but torch.compile's, on the torch of `python` (facts: its torch_facts)."""
    facts = facts or torch_facts(python)
    if not c.check(facts is not None, f"{python} imports torch and says what it has"):
        return []
    names = [r[0] for r in tc.ROWS if not r[3].endswith("_compile")]
    out = work / f"rows_{facts['version']}.jsonl"
    r = run(["--device", "cpu", "--smoke", "--steps", "2", "--warmup", "1", "--peak-tflops", "1", "--rows",
             ",".join(names), "--out", out], timeout=240, python=python)
    if not c.ok_run(r, f"torch_compare --device cpu --smoke on torch {facts['version']}, every row but "
                       "torch.compile's"):
        return []
    rows = json_lines(r.stdout)
    c.check([d["row"] for d in rows] == names, "one JSON line per row, in order", " ".join(d["row"] for d in rows))
    c.check(json_lines(out.read_text()) == rows, "--out holds the same lines")
    for d in rows:
        cfg = d["config"]
        flops, unit = mfu.flops_per_unit(cfg)
        common = (d["model"] in mfu.MODELS and d["batch"] > 0 and d["unit"] == unit and d["flops_per_unit"] == flops
                  and d["flops_per_step"] == flops * d["batch"] * cfg.get("context", 1) and d["smoke"] is True
                  and d["device"] == "cpu" and d["peak_tflops"] == 1.0)
        if d["mode"].startswith("amp") and not facts["amp_scaler"]:
            c.check(common and d["status"] == "skipped" and "cuda only" in d["error"],
                    f"{d['row']}: skipped, cuda only", d.get("error") or "")
            continue
        if d["mode"].startswith("amp"):
            # GradScaler starts at 2^16 and halves at each overflow, at most once a step (the smoke
            # ResNet-50 may overflow at every one); it grows only after 2000 clean steps, so the timed
            # steps' skips are the halvings since the warm-up. A disabled scaler would say 1.0 throughout.
            skipped, warm, final = d.get("skipped_steps"), d.get("warmup_loss_scale", 0), d.get("final_loss_scale", 0)
            ok = (isinstance(skipped, int) and 0 <= skipped <= d["steps"] and final * 2 ** skipped == warm
                  and 2.0 ** (16 - d["warmup"]) <= warm <= 2.0 ** 16 and math.log2(warm).is_integer())
            c.check(ok, f"{d['row']}: the GradScaler's skipped steps and loss scale",
                    f"skipped {skipped}, scale {warm} after the warm-up, {final} at the end")
        rate = d.get("tokens_per_s") if unit == "token" else d.get("samples_per_s")
        ok = (common and d["status"] == "ok" and d["error"] is None and rate and rate > 0 and d["rate"] == rate
              and d["step_ms"] > 0 and abs(d["mfu"] - rate * flops / 1e12) <= 1e-9 * d["mfu"]
              and abs(d["achieved_tflops"] - rate * flops / 1e12) <= 1e-9 * d["mfu"])
        if unit == "token":
            ok = ok and abs(d["tokens_per_s"] - d["samples_per_s"] * cfg["context"]) <= 1e-6 * rate
        c.check(ok, f"{d['row']}: ok, rate {rate and round(rate, 1)}/s > 0, FLOPs and MFU as mfu.py counts them",
                "" if ok else json.dumps(d)[:600])
    c.check(all(n in r.stdout.split("torch_compare: torch", 1)[-1] for n in names), "the table names every row")
    state = rows[0].get("fp32_precision") if rows else None
    c.check(bool(state) and "tf32" not in state.values() and all(d.get("fp32_precision") == state for d in rows),
            f"every row: TF32 off, as read back ({state})")
    return rows


def check_compile(c, work):
    args = ["--device", "cpu", "--smoke", "--steps", "2", "--warmup", "1", "--rows", "gpt2_bf16_compile"]
    r = run(args + ["--compile-budget", "60"], env={"MIX_TORCH_COMPARE_COMPILE_STUB": "0.2"})
    rows = json_lines(r.stdout) if r.rc == 0 else []
    ok = len(rows) == 1 and rows[0]["status"] == "ok" and rows[0]["tokens_per_s"] > 0 and rows[0]["compile_s"] >= 0.2
    c.check(ok, "a torch.compile row in its child process: ok, compile_s >= the stand-in's 0.2 s",
            "" if ok else r.describe(1500))
    r = run(args + ["--compile-budget", "3"], env={"MIX_TORCH_COMPARE_COMPILE_STUB": "60"})
    rows = json_lines(r.stdout) if r.rc == 0 else []
    ok = (len(rows) == 1 and rows[0]["status"] == "skipped" and "--compile-budget 3" in rows[0]["error"]
          and r.seconds < 40)
    c.check(ok, "a compile past --compile-budget 3: skipped, saying so, its child ended", "" if ok else r.describe(1500))
    import torch
    if not hasattr(torch, "compile"):
        r = run(args)
        rows = json_lines(r.stdout) if r.rc == 0 else []
        ok = len(rows) == 1 and rows[0]["status"] == "skipped" and "no torch.compile" in rows[0]["error"]
        c.check(ok, f"torch {torch.__version__} has no torch.compile: skipped, saying so", "" if ok else r.describe(1500))


def check_dry_run(c):
    r = run(["--dry-run", "--gpu-name", "NVIDIA H100 80GB HBM3", "--rows", "gpt2_amp,resnet50_amp,transformer_fp32"])
    rows = {d["row"]: d for d in json_lines(r.stdout)}
    ok = (r.rc == 0 and rows.get("gpt2_amp", {}).get("flops_per_unit") == 855_383_040
          and rows["gpt2_amp"]["flops_per_step"] == 855_383_040 * 8 * 1024
          and rows.get("resnet50_amp", {}).get("flops_per_unit") == 24_535_105_536
          and rows.get("transformer_fp32", {}).get("flops_per_unit") == 223_592_448
          and all(d["peak_tflops"] == 989.4 and d["status"] == "skipped" and d["torch"] is None
                  for d in rows.values()))
    c.check(ok, "--dry-run on an H100 SXM: GPT-2 855,383,040 FLOPs/token, ResNet-50 24,535,105,536/image, "
            "Transformer-base 223,592,448/token, 989.4 TFLOPS", "" if ok else r.describe(1500))


def check_no_torch(c, work):
    fake = work / "no_torch"
    fake.mkdir()
    (fake / "torch.py").write_text("raise ImportError('no torch here (test)')\n")
    (fake / "resnet50_amp.jsonl").write_text('{"summary": true, "samples_per_s_overall": 3000.0}\n')
    r = run(["--rows", "resnet50_*,gpt2_amp", "--out", fake / "torch_compare.jsonl"], env={"PYTHONPATH": str(fake)})
    rows = json_lines(r.stdout)
    want = [n for n, *_ in mt.load_script(SCRIPT).ROWS if n.startswith("resnet50_") or n == "gpt2_amp"]
    ok = (r.rc == 0 and [d["row"] for d in rows] == want
          and all(d["status"] == "skipped" and "PyTorch not importable" in d["error"] for d in rows))
    c.check(ok, "no importable torch: every row skipped, saying so, exit 0", "" if ok else r.describe(1500))
    r = mt.launch([sys.executable, SUMMARY, "--out", fake, "--gpu-name", "NVIDIA H200", "--torch-exit", "0"], 60)
    text = r.stdout.splitlines()
    ok = (r.rc == 0 and len(text) > 3 and text[1].startswith("  every PyTorch row skipped: PyTorch not importable")
          and "3000.0   7.4%" in text[3] and "PyTorch skipped" not in r.stdout)
    c.check(ok, "summary without PyTorch: the reason once, mixtrain's rows with their MFU",
            "" if ok else r.stdout[:800])


def check_resnet_impl(c, tc):
    import torch
    try:
        import torchvision
    except ImportError:
        print("(no torchvision: the written-out ResNet-50 is not compared with it)")
        return
    ours = tc.make_resnet50(torch, "script", 1000)[0].state_dict()
    theirs = torchvision.models.resnet50().state_dict()
    same = list(ours) == list(theirs) and all(ours[k].shape == theirs[k].shape for k in ours)
    c.check(same, f"the written-out ResNet-50: torchvision's {len(theirs)} state_dict names and shapes, in order")


def check_broken_torchvision(c, work, python=sys.executable):
    fake = work / "broken_torchvision"
    fake.mkdir()
    # What a torchvision built for another torch does on import.
    (fake / "torchvision.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    r = run(["--device", "cpu", "--smoke", "--steps", "1", "--warmup", "1", "--rows", "resnet50_fp32"],
            env={"PYTHONPATH": str(fake)}, python=python)
    rows = json_lines(r.stdout)
    ok = (r.rc == 0 and len(rows) == 1 and rows[0]["status"] == "ok"
          and rows[0]["impl"].startswith("written out")
          and "torchvision unusable: RuntimeError: operator torchvision::nms does not exist" in rows[0]["impl"])
    c.check(ok, "a torchvision that fails on import: ResNet-50 written out, saying why", "" if ok else r.describe(1500))


def check_tf32_refused(c, tc):
    from types import SimpleNamespace as NS

    class Setting:
        """A TF32 setting (a legacy allow_tf32 flag, or an op's fp32_precision) that keeps a value in
        `store` under `key`; a key in `stuck` ignores writes, as in a torch whose settings moved."""

        def __init__(self, store, key, stuck):
            self.store, self.key, self.stuck = store, key, stuck

        def __get__(self, obj, owner):
            return self.store[self.key]

        def __set__(self, obj, value):
            if self.key not in self.stuck:
                self.store[self.key] = value

    def fake_torch(stuck=(), new_api=False):
        """Legacy flags start on; torch 2.9's per-op precisions start at tf32 for conv, none elsewhere."""
        store = {"allow_matmul": True, "allow_cudnn": True, "matmul": "none", "conv": "tf32", "rnn": "none"}

        def holder(name, **settings):
            return type(name, (), {k: Setting(store, key, stuck) for k, key in settings.items()})()
        matmul = holder("Matmul", allow_tf32="allow_matmul", **({"fp32_precision": "matmul"} if new_api else {}))
        cudnn = holder("Cudnn", allow_tf32="allow_cudnn")
        if new_api:
            cudnn.conv, cudnn.rnn = holder("Conv", fp32_precision="conv"), holder("Rnn", fp32_precision="rnn")
        c_api = NS(**({"_get_fp32_precision_getter": lambda backend, op: store[op]} if new_api else {}))
        return NS(backends=NS(cuda=NS(matmul=matmul), cudnn=cudnn), _C=c_api)

    def refusal(torch):
        try:
            return f"accepted: {tc.turn_tf32_off(torch)}"
        except RuntimeError as e:
            return str(e)
    got = refusal(fake_torch())
    c.check(got == "accepted: {'matmul': 'ieee', 'conv': 'ieee'}", "TF32 off, the legacy flags read back", got)
    got = refusal(fake_torch(stuck=("allow_cudnn",)))
    c.check(got.startswith("TF32 still on for conv"), "a cuDNN flag that stays on: refused, naming conv", got)
    got = refusal(fake_torch(new_api=True))
    c.check(got == "accepted: {'matmul': 'ieee', 'conv': 'ieee', 'rnn': 'ieee'}",
            "torch 2.9's per-op precisions: each set to ieee and read back", got)
    got = refusal(fake_torch(stuck=("conv",), new_api=True))
    c.check(got.startswith("TF32 still on for conv after"),
            "torch 2.9's precisions: a conv that stays tf32 is refused, naming conv", got)


def check_first_line(c, tc):
    e = RuntimeError("backend='inductor' raised:\nRuntimeError: Failed to find C compiler\n\n")
    got = tc.first_line(e)
    c.check(got == "RuntimeError: Failed to find C compiler", "an error's reason: its last non-empty line", got)


def check_summary(c, work):
    d = work / "gc"
    d.mkdir()
    (d / "resnet50_amp.jsonl").write_text('{"step": 1}\n{"summary": true, "samples_per_s_overall": 3000.0, '
                                          '"peak_bytes": 5368709120, "skipped_steps": 2}\n')
    (d / "gpt2_amp.jsonl").write_text('{"summary": true, "tokens_per_s_overall": 400000.0}\n')
    rows = [{"row": "resnet50_amp", "status": "ok", "samples_per_s": 2500.0, "peak_bytes": 6442450944,
             "skipped_steps": 0, "torch": "9.9", "device_name": "NVIDIA H100 80GB HBM3", "flops_per_unit": 24_535_105_536},
            {"row": "resnet50_amp_compile", "status": "ok", "samples_per_s": 3750.0},
            {"row": "gpt2_amp", "status": "skipped", "error": "did not compile (test)"},
            {"row": "transformer_amp", "status": "ok", "samples_per_s": 10.0, "tokens_per_s": 2560.0}]
    (d / "torch_compare.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    r = mt.launch([sys.executable, SUMMARY, "--out", d, "--torch-exit", "0"], timeout=60)
    lines = {ln.split()[0]: ln for ln in r.stdout.splitlines()[2:] if ln.strip()}
    want = {"resnet50_amp": ["3000.0", "7.4%", "2500.0", "6.2%", "1.20", "5120 / 6144", "(skipped steps mix 2 / PT 0)"],
            "resnet50_amp_compile": ["3000.0", "7.4%", "3750.0", "9.3%", "0.80"],
            "gpt2_amp": ["400000.0", "34.6%", "PyTorch skipped: did not compile (test)"],
            "transformer_amp": ["2560.0", "0.1%", "no mixtrain figure in transformer_amp.jsonl"]}
    head = r.stdout.splitlines()[0] if r.stdout else ""
    c.check(r.rc == 0 and "989.4 TFLOPS (H100 SXM)" in head and "PyTorch 9.9" in head,
            "summary: the card and its peak, taken from the PyTorch rows", head)
    for row, parts in want.items():
        line = lines.get(row, "")
        c.check(all(p in line for p in parts), f"summary row {row}: {', '.join(parts)}", line)
    c.check("gpt2_fp32" not in lines, "summary: a row that ran on neither side is left out")
    c.check("skipped steps" not in lines.get("gpt2_amp", "x skipped steps"), "summary: no skipped steps, no note",
            lines.get("gpt2_amp", ""))


def main():
    c = mt.Checks("torch_compare")
    try:
        import torch  # noqa: F401
    except ImportError:
        mt.skip(f"{sys.executable} has no torch (Debian: python3-torch)")
    work = mt.workdir("torch_compare")
    tc = mt.load_script(SCRIPT)
    check_dry_run(c)
    check_summary(c, work)
    check_no_torch(c, work)
    check_resnet_impl(c, tc)
    check_broken_torchvision(c, work)
    check_first_line(c, tc)
    check_tf32_refused(c, tc)
    check_smoke(c, tc, work)
    check_compile(c, work)
    c.finish()


if __name__ == "__main__":
    main()
