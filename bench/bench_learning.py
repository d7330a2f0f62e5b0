"""Learning-speed benchmark: progressive alignment on a synthetic gateway stream.

Simulates DESIGN.md section 6's learning target on this machine's CPU: signals arrive at
`--rate` per second of *virtual* time; each training step advances the clock by its
measured wall time, so a slow machine sees more signals per step, as the daemon would.
Every signal is scored by the serving snapshot before it is trained on; the serving
snapshot is refreshed every `swap_every_steps` steps (as the daemon does). The policy
switches from v1 to v2 after `--switch-at` signals.

    .venv/bin/python bench/bench_learning.py --preset flint --lr 1e-3
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np

from gated.engine import AdamW, Model, ModelConfig, build_batch, source_batch, train_step
from gated.synthetic import SyntheticGateway
from gated.trainer import AlignmentWindow, TrainSettings

LABEL = {"override_allow": (1.0, 2.0), "override_block": (0.0, 2.0),
         "false_positive": (1.0, 4.0), "false_negative": (0.0, 4.0)}


def example_from_signal(sig: dict) -> dict:
    """Label and weight per DESIGN.md's table (first-time escalation weight)."""
    label, weight = LABEL.get(sig.get("feedback"), (1.0 if sig["decision"] == "allow" else 0.0,
                                                    1.0))
    return {"context": sig["context"], "history": sig.get("history"),
            "reason": sig.get("reason"), "label": label, "weight": weight}


def run(preset: str, lr: float, rate: float, n_signals: int, switch_at: int, seed: int,
        max_fresh_per_step: int) -> dict:
    cfg = ModelConfig.preset(preset)
    s = TrainSettings(lr=lr)
    model = Model.init(cfg, seed=seed)
    serving = Model.from_flat(cfg, model.flat)
    opt = AdamW.for_model(model, lr=lr, weight_decay=s.weight_decay, clip_norm=s.clip_norm)
    gen = SyntheticGateway(seed=seed)
    rng = random.Random(seed)
    reservoir: list[dict] = []
    window = AlignmentWindow(1000)
    clock, next_signal, produced, steps = 0.0, 0.0, 0, 0
    pending: list[dict] = []
    first_converged = recovered = None
    min_after_switch = 1.0
    trace = []
    n_fresh = max(1, round(s.batch_size * (1 - s.replay_fraction)))
    while produced < n_signals:
        while next_signal <= clock and produced < n_signals:
            if produced == switch_at:
                gen.policy = "v2"
            pending.append(example_from_signal(gen.signal()))
            produced += 1
            next_signal += 1.0 / rate
        if not pending:
            clock = next_signal
            continue
        take, pending = pending[:max_fresh_per_step], pending[max_fresh_per_step:]
        p = serving.predict_proba(source_batch([(e["context"], e["history"]) for e in take],
                                               cfg))
        for pa, ex in zip(p, take, strict=True):
            window.add(float(pa), ex["label"])
            n = window.total_scored
            if window.full and first_converged is None and window.alignment >= 0.95:
                first_converged = n
            if n > switch_at:
                min_after_switch = min(min_after_switch, window.alignment)
                if recovered is None and min_after_switch < 0.90 and window.alignment > 0.90:
                    recovered = n - switch_at
        t0 = time.perf_counter()
        fresh = take[:n_fresh]
        replay = rng.sample(reservoir, min(len(reservoir), s.batch_size - len(fresh)))
        train_step(model, opt, build_batch(fresh + replay, cfg))
        clock += time.perf_counter() - t0
        reservoir.extend(take)
        if len(reservoir) > 10_000:
            reservoir[rng.randrange(len(reservoir))] = reservoir.pop()
        steps += 1
        if steps % s.swap_every_steps == 0:
            serving = Model.from_flat(cfg, model.flat)
        if window.total_scored % 250 < len(take):
            trace.append((window.total_scored, round(window.alignment, 3)))
    return {"preset": preset, "lr": lr, "steps": steps, "virtual_s": round(clock, 1),
            "converged_at": first_converged, "recovered_after": recovered,
            "min_after_switch": round(min_after_switch, 3), "trace": trace}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="flint")
    ap.add_argument("--lr", type=float, nargs="+", default=[1e-3])
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--signals", type=int, default=5000)
    ap.add_argument("--switch-at", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-fresh-per-step", type=int, default=64)
    a = ap.parse_args()
    print("| preset | lr | steps | virtual s | alignment >= 0.95 at signal | "
          "back > 0.90 after switch (signals) | min after switch |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for lr in a.lr:
        r = run(a.preset, lr, a.rate, a.signals, a.switch_at, a.seed, a.max_fresh_per_step)
        print(f"| {r['preset']} | {lr:g} | {r['steps']} | {r['virtual_s']} | "
              f"{r['converged_at']} | {r['recovered_after']} | {r['min_after_switch']} |",
              flush=True)
        print("   trace:", r["trace"], flush=True)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
