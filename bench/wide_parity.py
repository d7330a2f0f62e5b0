"""The wide path on two backends, signal by signal: does the GPU learn what the CPU learns?

Why (docs/learning.md, "The first seconds on a GPU"): on an H100 the first checkpoint of the
learning benchmark was lost even with the transformer frozen (lr 0: the wide path alone,
0.750 against 0.892 for the same stream on the same machine's CPU). This feeds the same
stream to the trainer's own code on each backend named -- one signal at a time, scored on
the serving snapshot, learned by the wide path, published -- without any transformer step,
and compares what they score and the wide weights they end with.

    python3 bench/wide_parity.py --signals 500 numpy cupy
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gated.config import TrainConfig  # noqa: E402
from gated.daemon.trainer import build_trainer  # noqa: E402
from gated.engine import ModelConfig  # noqa: E402
from gated.store import Store  # noqa: E402
from gated.traffic import GatewayTraffic  # noqa: E402


def feed(backend: str, n: int, seed: int) -> dict[str, np.ndarray]:
    """Scores (z, p) of `n` stream signals and the wide slots afterwards, on `backend`."""
    cfg = ModelConfig.preset("flint")
    settings = dataclasses.replace(TrainConfig(), lr=0.0)
    traffic = GatewayTraffic(seed=seed)
    z, p, true, took = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="gated-wide-parity-") as tmp:
        store = Store(tmp)
        trainer, _serving = build_trainer(store, cfg, settings, seed=seed, backend=backend)
        for _ in range(n):
            ev = traffic.next()
            store.append_signals([ev.signal])
            t0 = time.perf_counter()
            trainer._take(store.read_signals(trainer.status.last_trained_seq, 16))
            took.append(time.perf_counter() - t0)
            for _seq, pi, zi, _zd, _open in trainer.take_scores():
                z.append(zi)
                p.append(pi)
                true.append(ev.true_allow)
            trainer.publish_now()
        to_np = trainer.model.ops.to_numpy
        wide = {k: np.asarray(to_np(v), np.float64) for k, v in trainer.model.params.items()
                if k.startswith("wide.")}
        store.close()
    return {"z": np.array(z), "p": np.array(p), "true": np.array(true),
            "took": np.array(took), **wide}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("backends", nargs=2)
    ap.add_argument("--signals", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    runs = [feed(b, a.signals, a.seed) for b in a.backends]
    for b, r in zip(a.backends, runs, strict=True):
        acc = float(np.mean((r["p"] >= 0.5) == r["true"]))
        print(f"{b}: {len(r['z'])} scored, accuracy vs TRUE {acc:.3f}, "
              f"last 200 {float(np.mean((r['p'][-200:] >= 0.5) == r['true'][-200:])):.3f}; "
              f"a signal scored and learned (the trainer's `_take`, no transformer step) "
              f"{np.median(r['took']) * 1e3:.1f} ms median, "
              f"{np.percentile(r['took'], 90) * 1e3:.1f} ms p90 (the first 20 left out: "
              f"{np.median(r['took'][20:]) * 1e3:.1f} ms)")
    x, y = runs
    dz = np.abs(x["z"] - y["z"])
    first = int(np.argmax(dz > 1e-3)) if (dz > 1e-3).any() else -1
    print(f"|z difference|: max {dz.max():.3g}, first signal over 1e-3: {first}")
    for k in sorted(k for k in x if k.startswith("wide.")):
        d = np.abs(x[k] - y[k])
        print(f"{k}: max |difference| {d.max():.3g}, entries that differ > 1e-4: "
              f"{int((d > 1e-4).sum())} of {d.size}; norms {np.linalg.norm(x[k]):.4g} / "
              f"{np.linalg.norm(y[k]):.4g}")


if __name__ == "__main__":
    main()
