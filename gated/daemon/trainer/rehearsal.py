"""A dress rehearsal of the trainer on throwaway state, before a GPU trainer starts.

Why (measured on an H100, docs/learning.md "The first seconds on a GPU"): CuPy compiles
each of its own kernels (element-wise, reductions, gathers, scatters) the first time a
dtype and rank combination is used, and a fresh machine has no kernel cache. The engine's
own kernels are compiled up front (`CupyOps.warmup`) and a dry step fills the memory pool
(`reserve_training_memory`), but scoring on the serving snapshot, the wide path's
updates, a swap and a checkpoint still compiled on the first signals: the first
`train_on` took ~8 s, the signals that arrived meanwhile were all scored by a snapshot
that had learned from one signal, and the first 500-signal checkpoint of the learning
benchmark was lost to the anchor by 0.11 on seeds 0 and 2 -- with the transformer frozen
too (lr 0: 0.750 against 0.892 on the same machine's CPU). The wide path itself computes
the same on both backends (bench/wide_parity.py: logits within 1.2e-6 over 500 signals).

The rehearsal runs the trainer's own path -- several helpings of synthetic signals
(gated.synthetic) scored, learned by the wide path, stepped, published and checkpointed --
in a temporary store, then throws it all away. Only what the process compiled stays.
"""

from __future__ import annotations

import tempfile
import time

from ...config import TrainConfig
from ...engine import ModelConfig
from ...store import Store
from ...synthetic import SyntheticGateway
from .resume import build_trainer

#: helpings of fresh signals fed to the rehearsal trainer: a lone signal (the steady
#: state), a backlog (a burst scored in length-sorted chunks), then lone ones again
HELPINGS = (1, 40, 1, 1)


def rehearse(model_cfg: ModelConfig, settings: TrainConfig, backend: str) -> dict:
    """Run the trainer's path on throwaway state on `backend`; returns what it did
    (steps, swaps, seconds). Nothing of it is kept but the process's compiled kernels."""
    t0 = time.perf_counter()
    gateway = SyntheticGateway(seed=0)
    steps = 0
    with tempfile.TemporaryDirectory(prefix="gated-rehearsal-") as tmp:
        store = Store(tmp, replay_slots=256)
        try:
            trainer, _ = build_trainer(store, model_cfg, settings, seed=0, backend=backend)
            trainer.publish_now()
            for n in HELPINGS:
                store.append_signals([gateway.signal() for _ in range(n)])
                fresh = store.read_signals(trainer.status.last_trained_seq, n)
                steps += trainer.train_on(fresh) is not None
                trainer.publish_now()
            steps += trainer.train_on([]) is not None  # a replay-only step
            trainer.checkpoint()
            swaps = trainer.status.swaps
        finally:
            store.close()
    return {"steps": steps, "swaps": swaps, "seconds": time.perf_counter() - t0}
