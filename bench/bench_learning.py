"""Learning-speed benchmark: progressive alignment of the real trainer on a synthetic stream.

DESIGN.md section 6: on a realistic gateway stream arriving at 20 signals/s, at the
default preset on the CPU, progressive alignment reaches 0.95 over 1000 signals within
3,000 signals, and after the policy changes it is back above 0.90 within 1,500 signals.

This drives the daemon's own `Trainer` (real LMDB store in a temp dir, real replay
reservoir, real serving snapshot and swaps) step by step, on a *virtual* clock: signals
arrive at `--rate` per second of virtual time and each step advances the clock by its
measured wall time, so a slow machine sees more signals per step, exactly as the daemon
would. The synthetic gateway switches from policy v1 to v2 (downloads become blocked)
after `--switch-at` signals.

    .venv/bin/python bench/bench_learning.py --preset flint --lr 1e-3 --write
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import tempfile
import time

import numpy as np

from gated.config import TrainConfig
from gated.engine import ModelConfig
from gated.store import Store
from gated.synthetic import SyntheticGateway
from gated.trainer import build_trainer


def run(preset: str, lr: float, rate: float, n_signals: int, switch_at: int,
        seed: int) -> dict:
    cfg = ModelConfig.preset(preset)
    settings = dataclasses.replace(TrainConfig(), lr=lr)
    with tempfile.TemporaryDirectory(prefix="gated-learn-") as tmp:
        store = Store(tmp)
        trainer, _ = build_trainer(store, cfg, settings, seed=seed)
        gen = SyntheticGateway(seed=seed)
        clock, produced, steps = 0.0, 0, 0
        converged_at = recovered_after = None
        dipped = False
        trace = []
        while trainer.window.total_scored < n_signals:
            due = min(n_signals, int(clock * rate) + 1)
            if due > produced:
                batch = []
                for _ in range(due - produced):
                    if produced == switch_at:
                        gen.policy = "v2"
                    batch.append(gen.signal())
                    produced += 1
                store.append_signals(batch)
            fresh = store.read_signals(trainer.status.last_trained_seq, settings.batch_size)
            if not fresh:
                clock = produced / rate
                continue
            t0 = time.perf_counter()
            trainer.train_on(fresh)
            clock += time.perf_counter() - t0
            steps += 1
            w = trainer.window
            n = w.total_scored
            if converged_at is None and w.full and w.alignment >= 0.95:
                converged_at = n
            if n > switch_at:
                dipped = dipped or w.alignment < 0.90
                if dipped and recovered_after is None and w.alignment > 0.90:
                    recovered_after = n - switch_at
            if not trace or n - trace[-1][0] >= 250:
                trace.append((n, round(w.alignment, 3)))
        store.close()
    return {"preset": preset, "lr": lr, "steps": steps, "virtual_s": round(clock, 1),
            "converged_at": converged_at, "dipped": dipped,
            "recovered_after": recovered_after, "trace": trace}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="flint")
    ap.add_argument("--lr", type=float, nargs="+", default=[1e-3])
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--signals", type=int, default=4500)
    ap.add_argument("--switch-at", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", action="store_true", help="record in docs/benchmarks.md")
    a = ap.parse_args()
    lines = [
        f"Machine: {platform.machine()}, {len(os.sched_getaffinity(0))} cores, Python "
        f"{platform.python_version()}, numpy {np.__version__}; {a.rate:g} signals/s of "
        f"virtual time, policy v1 -> v2 after {a.switch_at} signals, seed {a.seed}.",
        "",
        "| preset | lr | steps | virtual s | window >= 0.95 at signal (target <= 3000) | "
        "back > 0.90 after the switch, signals (target <= 1500) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    print("\n".join(lines), flush=True)
    traces = []
    for lr in a.lr:
        r = run(a.preset, lr, a.rate, a.signals, a.switch_at, a.seed)
        back = r["recovered_after"] if r["dipped"] else "never below 0.90"
        line = (f"| {r['preset']} | {lr:g} | {r['steps']} | {r['virtual_s']} | "
                f"{r['converged_at']} | {back} |")
        lines.append(line)
        traces.append(f"- lr {lr:g}, (signals scored, window alignment): {r['trace']}")
        print(line, "\n", traces[-1], flush=True)
    if a.write:
        from docs_section import write_section

        head = f"## Learning ({a.preset}, CPU)"
        cmd = (f"`.venv/bin/python bench/bench_learning.py --preset {a.preset} --lr "
               f"{' '.join(f'{x:g}' for x in a.lr)} --signals {a.signals} --write`")
        write_section(head, f"{head}\n\nCommand: {cmd}\n\n" + "\n".join(lines) + "\n\n"
                      + "\n".join(traces))


if __name__ == "__main__":
    main()
