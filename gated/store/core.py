"""`Store`: the daemon's durable state in one LMDB environment (DESIGN.md section 4)."""

from __future__ import annotations

import os
from typing import Any

from ..signals import DEFAULT_WEIGHTS, WeightTable
from .checkpoint import Checkpoints
from .env import DEFAULT_MAP_SIZE, DEFAULT_MAX_MAP_SIZE, acquire, release
from .errors import StoreError
from .history import MetricsHistory
from .log import SignalLog
from .replay import Reservoir
from .trust import TrustStore


class Store(SignalLog, Reservoir, Checkpoints, MetricsHistory, TrustStore):
    """Signals, dedup, escalation, replay, checkpoint, published weights, metrics history,
    the override memory and the audit log (trust.py).

    Thread-safe: any thread may call any method; every call is one short transaction
    (no long-lived readers). Write calls return only after their commit. One LMDB
    environment per state dir per process: Store objects on the same dir share it, and a
    Store must not be used after fork() (open a new one in the child).

    ``map_size`` is where the map starts; it grows on demand (x``growth``) up to
    ``max_map_size``, beyond which writes fail with `StoreFullError`.
    """

    def __init__(self, state_dir: str | os.PathLike[str], *, map_size: int = DEFAULT_MAP_SIZE,
                 max_map_size: int = DEFAULT_MAX_MAP_SIZE, growth: float = 2.0,
                 weights: WeightTable | None = None, replay_slots: int = 10_000,
                 metrics_cap: int = 100_000, metrics_flush_records: int = 64,
                 metrics_flush_seconds: float = 2.0) -> None:
        if replay_slots < 1:
            raise ValueError("replay_slots must be >= 1")
        self.path = os.path.realpath(os.fspath(state_dir))
        self.weights = weights or DEFAULT_WEIGHTS
        self.replay_slots = int(replay_slots)
        self.metrics_cap = int(metrics_cap)
        self.metrics_flush_records = max(1, int(metrics_flush_records))
        self.metrics_flush_seconds = float(metrics_flush_seconds)
        self._init_metrics()
        self._closed = True
        self._h = acquire(self.path, readonly=False, map_size=map_size,
                          max_map_size=max_map_size, growth=growth)
        self._closed = False

    def set_weights(self, table: WeightTable) -> None:
        """Use ``table`` for signals appended from now on (config hot reload). Signals
        already stored keep the label and weight decided when they were acknowledged."""
        if not isinstance(table, WeightTable):
            raise TypeError(f"expected a WeightTable, got {type(table).__name__}")
        self.weights = table

    @property
    def stats(self) -> dict[str, int]:
        """Map grows, remaps and reopens handled, commits made (this process)."""
        return dict(self._h.stats)

    def map_size(self) -> int:
        """The current LMDB map size in bytes."""
        def fn(_txn: Any) -> int:
            assert self._h.env is not None
            return int(self._h.env.info()["map_size"])
        return self._h.read(fn)

    def close(self) -> None:
        """Commit staged metrics and release this Store; the environment closes with the
        last Store on it."""
        if not self._closed:
            try:
                self.flush()
            finally:
                self._closed = True
                release(self._h)

    def __enter__(self) -> Store:
        if self._closed:
            raise StoreError(f"the store for {self.path} is closed")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.path!r}{', closed' if self._closed else ''})"
