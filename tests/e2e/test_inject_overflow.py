#!/usr/bin/python3
"""--inject-overflow STEP[:RANK[:PARAM]]: an overflow on one rank makes every rank
skip that step, the loss scaler counts it, and the skipped step touches nothing.

amp/unscale_pass.h: the inject_overflow op runs after each gradient bucket's
all-reduce completes, before the bucket's unscale, and writes +inf into the
first element of that rank's reduced gradients (all of them, or PARAM's only)
at optimizer step STEP (1-based, as the metrics count). Only that rank sees it
locally, so rank 0 skipping proves the found_inf all-reduce
(c_allreduce_found_inf) carried it. (Which parameter and rank the log names:
e2e.test_overlap.)

Scaler semantics (docs/design.md "The loss scaler", amp/loss_scaling_math.h): an overflow
sets good=0, bad+=1, and the scale shrinks by decr_ratio (0.8) only when
bad == decr_every_n_nan_or_inf (Paddle's default 2), then bad=0. So:
  - defaults: one injected overflow leaves the scale alone and bad_steps = 1;
  - --decr-every-n-nan-or-inf 1: the scale drops at step 5 to f32(32768 * 0.8).

For 2 ranks (inject on rank 1) and 4 ranks (inject on rank 3), checks:
  1. step 5's metrics line has found_inf and skipped true, no other step does,
     the summary counts 1 skipped step, and the job ends within its timeout;
  2. the scale, the summary's final_loss_scale and the checkpointed counters
     follow the semantics above;
  3. --steps 5 with the injection at 5 and --steps 4 without it save
     bit-identical parameters AND optimizer state (momentum buffers, step):
     the skipped step touched nothing; the same with STEP:RANK:fc1.weight.
"""
import sys

import numpy as np

import mixtest as mt

INIT_SCALE = np.float32(32768)
DECR = np.float32(0.8)


def main():
    mt.require_mixtrain()
    mt.require_mpirun()
    c = mt.Checks("inject_overflow")
    d = mt.workdir("inject_overflow")
    base = ["--precision", "amp", *mt.synthetic(size=512, features=32, classes=5, hidden=(32, 16)),
            "--batch-size", 16, "--eval", "false", "--seed", 7, "--optimizer", "momentum", "--lr", "0.05"]

    for world in (2, 4):
        victim = world - 1
        tag = f"{world} ranks"

        # ---- 1 and 2 with the default scaler (decrease after 2 overflows) ----------------------
        met, ckpt = d / f"w{world}_default.jsonl", d / f"w{world}_inject5.safetensors"
        r = mt.mixtrain([*base, "--steps", 5, "--inject-overflow", f"5:{victim}", "--metrics", met, "--save", ckpt],
                        np=world, timeout=90)
        if c.ok_run(r, f"{tag}: --inject-overflow 5:{victim}, 5 steps"):
            m = mt.Metrics(met)
            s5 = m.step(5)
            c.check(s5["found_inf"] is True and s5["skipped"] is True, f"{tag}: step 5 has found_inf and skipped",
                    f"found_inf={s5['found_inf']} skipped={s5['skipped']}")
            others = [s["step"] for s in m.steps if s["step"] != 5 and (s["found_inf"] or s["skipped"])]
            c.check(not others, f"{tag}: no other step skipped", f"{others}")
            c.check(m.summary is not None and m.summary.get("skipped_steps") == 1, f"{tag}: summary counts 1 skip",
                    f"{m.summary and m.summary.get('skipped_steps')}")
            scales = [s["loss_scale"] for s in m.steps]
            c.check(all(np.float32(x) == INIT_SCALE for x in scales),
                    f"{tag}: default decr_every_n_nan_or_inf=2: one overflow leaves the scale at 32768", f"{scales}")
            _, meta = mt.load_checkpoint(ckpt)
            got = {k: meta.get(k) for k in ("scaler_bad_steps", "scaler_good_steps", "scaler_skipped_steps")}
            c.check(got == {"scaler_bad_steps": "1", "scaler_good_steps": "0", "scaler_skipped_steps": "1"},
                    f"{tag}: checkpointed scaler counters after the overflow: bad 1, good 0, skipped 1", f"{got}")

            # The second consecutive overflow (resumed with bad=1, injected at step 6) is the one that shrinks.
            met2 = d / f"w{world}_second.jsonl"
            r = mt.mixtrain([*base, "--steps", 7, "--resume", ckpt, "--inject-overflow", f"6:{victim}",
                             "--metrics", met2], np=world, timeout=90)
            if c.ok_run(r, f"{tag}: --resume after the overflow, a 2nd overflow at step 6"):
                m2 = mt.Metrics(met2)
                got = [(s["step"], np.float32(s["loss_scale"]), s["skipped"]) for s in m2.steps]
                want = [(6, INIT_SCALE * DECR, True), (7, INIT_SCALE * DECR, False)]
                c.check(got == want, f"{tag}: 2nd consecutive overflow shrinks the scale to {INIT_SCALE * DECR}",
                        f"{[(a, float(b), s) for a, b, s in got]}")

        # ---- 2 with --decr-every-n-nan-or-inf 1: the drop happens at step 5 -----------------------
        met = d / f"w{world}_decr1.jsonl"
        r = mt.mixtrain([*base, "--steps", 8, "--inject-overflow", f"5:{victim}", "--decr-every-n-nan-or-inf", 1,
                         "--metrics", met], np=world, timeout=90)
        if c.ok_run(r, f"{tag}: --inject-overflow 5:{victim} --decr-every-n-nan-or-inf 1, 8 steps"):
            m = mt.Metrics(met)
            scales = [np.float32(s["loss_scale"]) for s in m.steps]
            want = [INIT_SCALE] * 4 + [INIT_SCALE * DECR] * 4
            c.check(scales == want, f"{tag}: scale 32768 for steps 1-4, 32768*0.8 = {INIT_SCALE * DECR} from step 5",
                    f"{[float(x) for x in scales]}")
            final = m.summary and m.summary.get("final_loss_scale")
            c.check(final is not None and np.float32(final) == INIT_SCALE * DECR,
                    f"{tag}: the summary's final_loss_scale is the scale after the drop, {INIT_SCALE * DECR}",
                    f"{final}")
            flags = [s["step"] for s in m.steps if s["found_inf"] or s["skipped"]]
            c.check(flags == [5], f"{tag}: only step 5 skipped in 8 steps", f"{flags}")
            c.check("step 5: gradients overflowed" in r.out, f"{tag}: rank 0 warns about step 5")

        # ---- 3: a skipped step changes nothing ------------------------------------------------
        ref = d / f"w{world}_ref4.safetensors"
        r = mt.mixtrain([*base, "--steps", 4, "--save", ref], np=world, timeout=90)
        if not c.ok_run(r, f"{tag}: 4 steps, no injection"):
            continue
        ref_t, _ = mt.load_checkpoint(ref)
        targeted = d / f"w{world}_inject5_fc1.safetensors"
        r = mt.mixtrain([*base, "--steps", 5, "--inject-overflow", f"5:{victim}:fc1.weight", "--save", targeted,
                         "--metrics", d / f"w{world}_fc1.jsonl"], np=world, timeout=90)
        if c.ok_run(r, f"{tag}: --inject-overflow 5:{victim}:fc1.weight, 5 steps"):
            s5 = mt.Metrics(d / f"w{world}_fc1.jsonl").step(5)
            c.check(s5["skipped"] is True, f"{tag}: one parameter's overflow skips step 5 too")
        for path, what in ((ckpt, f"5:{victim}"), (targeted, f"5:{victim}:fc1.weight")):
            if not path.exists():
                continue
            got_t, _ = mt.load_checkpoint(path)
            differing = sorted(k for k in ref_t if k not in got_t or not mt.bit_identical(ref_t[k], got_t[k]))
            n_opt = sum(k.startswith("optimizer.") for k in ref_t)
            c.check(set(got_t) == set(ref_t) and not differing and n_opt > 0,
                    f"{tag}: 5 steps with {what} == 4 steps without, bit for bit "
                    f"({len(ref_t) - n_opt} parameters, {n_opt} optimizer tensors)",
                    f"differing: {differing}")
            step_t = got_t.get("optimizer.step")
            if step_t is not None:
                c.check(int(step_t.ravel()[0]) == 4, f"{tag} {what}: optimizer.step stays 4", f"{step_t}")
    c.finish()


if __name__ == "__main__":
    sys.exit(main())
