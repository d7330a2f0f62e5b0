"""What every part of the Store shares: the env handle, the weight table, small meta helpers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import lmdb

from ..signals import WeightTable
from .codec import from_u64, u64
from .env import EnvHandle

T = TypeVar("T")


class StoreBase:
    """Attributes the mixins of `gated.store.Store` rely on (set by `Store.__init__`)."""

    _h: EnvHandle
    path: str
    weights: WeightTable
    replay_slots: int
    metrics_cap: int

    def _db(self, name: str) -> Any:
        db = self._h.db(name)
        if db is None:  # only a read-only env can miss a database
            raise LookupError(name)
        return db

    def _meta_int(self, txn: lmdb.Transaction, key: bytes, default: int = 0) -> int:
        db = self._h.db("meta")
        raw = txn.get(key, db=db) if db is not None else None
        return from_u64(raw) if raw is not None else default

    def _meta_put_int(self, txn: lmdb.Transaction, key: bytes, value: int) -> None:
        txn.put(key, u64(value), db=self._db("meta"))

    def _write_with_metrics(self, fn: Callable[[lmdb.Transaction], T], *, what: str) -> T:
        """A write transaction that may also carry staged metrics (see history.py)."""
        return self._h.write(fn, what=what)
