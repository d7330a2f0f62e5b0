"""Bounded metrics history (per-step loss, alignment, learning rate) for `gated report`.

Keyed by an internal 8-byte counter, not by step: after a restart from an older checkpoint
the trainer repeats step numbers, and both runs belong in the history, in order.

Write-behind: a durable commit costs an fsync (milliseconds), more than a training step
of the tiny model, and the history is a report, not state. `append_metrics` stages the
record; staged records ride along in the trainer's next write transaction (replay,
checkpoint, publish) or commit on their own after ``metrics_flush_records`` records or
``metrics_flush_seconds``. A kill -9 loses at most those last staged records; readers in
this process see them at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import lmdb

from .base import StoreBase
from .codec import from_u64, pack, u64, unpack

T = TypeVar("T")


class MetricsHistory(StoreBase):
    """`append_metrics`, `read_metrics`, `count_metrics`, `flush`."""

    metrics_flush_records: int = 64
    metrics_flush_seconds: float = 2.0

    def _init_metrics(self) -> None:
        self._staged: list[bytes] = []
        self._staged_since = 0.0
        self._flush_lock = threading.Lock()

    def append_metrics(self, step: int, record: Mapping[str, Any]) -> None:
        """Add one record (a flat dict of numbers/strings); the oldest records beyond
        ``metrics_cap`` are dropped when it is written."""
        if not self._staged:
            self._staged_since = time.monotonic()
        self._staged.append(pack({**record, "step": int(step)}))
        if (len(self._staged) >= self.metrics_flush_records
                or time.monotonic() - self._staged_since >= self.metrics_flush_seconds):
            self.flush()

    def flush(self) -> None:
        """Commit staged metrics records now."""
        if self._staged:
            self._write_with_metrics(lambda txn: None, what="metrics history")

    def _write_metrics_txn(self, txn: lmdb.Transaction, batch: list[bytes]) -> None:
        db = self._db("metrics")
        cur = txn.cursor(db=db)
        nxt = from_u64(cur.key()) + 1 if cur.last() else 1
        for data in batch:
            txn.put(u64(nxt), data, db=db, append=True)
            nxt += 1
        excess = txn.stat(db)["entries"] - max(1, self.metrics_cap)
        if excess > 0 and cur.first():
            for _ in range(excess):
                cur.delete()

    def _write_with_metrics(self, fn: Callable[[lmdb.Transaction], T], *, what: str) -> T:
        """Run ``fn`` in one write transaction that also commits the staged metrics."""
        if not self._staged or not self._flush_lock.acquire(blocking=False):
            return self._h.write(fn, what=what)
        try:
            batch = list(self._staged)  # appends only go to the end meanwhile

            def both(txn: lmdb.Transaction) -> T:
                result = fn(txn)
                self._write_metrics_txn(txn, batch)
                return result

            result = self._h.write(both, what=what)
            del self._staged[:len(batch)]
            return result
        finally:
            self._flush_lock.release()

    def read_metrics(self, limit: int = 1000) -> list[dict[str, Any]]:
        """The newest ``limit`` records, oldest first; each has ``step`` plus its fields."""
        if limit <= 0:
            return []
        with self._flush_lock:  # no flush moves staged records while we read both parts
            return self._read_metrics(limit)

    def _read_metrics(self, limit: int) -> list[dict[str, Any]]:
        limit = min(limit, max(1, self.metrics_cap))
        staged = [unpack(d) for d in list(self._staged)[-limit:]]
        want = limit - len(staged)

        def fn(txn: lmdb.Transaction) -> list[dict[str, Any]]:
            db = self._h.db("metrics")
            out: list[dict[str, Any]] = []
            if db is None or want <= 0:
                return out
            cur = txn.cursor(db=db)
            if cur.last():
                for _key, value in cur.iterprev():
                    out.append(unpack(value))
                    if len(out) >= want:
                        break
            out.reverse()
            return out
        return self._h.read(fn) + staged

    def count_metrics(self) -> int:
        """Records held (committed, capped, plus staged)."""
        def fn(txn: lmdb.Transaction) -> int:
            db = self._h.db("metrics")
            return txn.stat(db)["entries"] if db is not None else 0
        return min(self._h.read(fn) + len(self._staged), max(1, self.metrics_cap))
