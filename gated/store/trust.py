"""The trust state: the override memory and the audit log of served predictions.

Both are written by the daemon process only (the trainer never touches them), each in
its own named database:

- ``overrides``: (context, history) fingerprint (16 bytes) -> msgpack ``{label, feedback,
  ts, seq, tool}``: a person's correction, honoured by ``predict`` until the model agrees
  with it or it expires (gated/daemon/trust.py). Bounded by the daemon
  (``overrides.max_entries``); the whole memory is loaded at start.
- ``audit``: prediction id (8-byte big-endian, the id's 16 hex digits) -> msgpack ``{ts,
  op, version, p_allow, band, source, latency_ms, tool}`` (+ ``rule`` / ``override`` for
  those sources, + ``outcome`` and ``seq`` once a signal referenced the id). Ids grow
  with time (microseconds since the epoch, made strictly increasing), so a key range is
  a time range and retention deletes from the front. Bounded by ``audit.max_entries``
  and ``audit.max_age_s``.

:func:`read_audit` reads the audit log of a state dir read-only (``gated audit``), with
the daemon running or not, like ``gated inspect``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import lmdb

from .base import StoreBase
from .codec import from_u64, pack, u64, unpack
from .env import acquire, current, release

#: Records deleted per retention pass at most (keeps one transaction short).
PRUNE_CHUNK = 5000


def id_key(prediction_id: str) -> bytes | None:
    """The audit key of a prediction id (16 hex digits), or None if it is not one of ours."""
    if len(prediction_id) != 16:
        return None
    try:
        return u64(int(prediction_id, 16))
    except ValueError:
        return None


def key_id(key: bytes | memoryview) -> str:
    return f"{from_u64(key):016x}"


class TrustStore(StoreBase):
    """Store mixin: ``overrides_*`` and ``audit_*`` (one short transaction per call)."""

    # --- overrides --------------------------------------------------------------------
    def overrides_all(self) -> list[tuple[bytes, dict[str, Any]]]:
        """Every stored override, as (fingerprint, record)."""
        def fn(txn: lmdb.Transaction) -> list[tuple[bytes, dict[str, Any]]]:
            db = self._h.db("overrides")
            if db is None:
                return []
            return [(bytes(k), unpack(v)) for k, v in txn.cursor(db=db)]
        return self._h.read(fn)

    def overrides_apply(self, puts: Sequence[tuple[bytes, dict[str, Any]]],
                        deletes: Iterable[bytes] = ()) -> None:
        """Write and delete overrides in one committed transaction (puts win over a delete
        of the same fingerprint listed with them)."""
        put_keys = {fp for fp, _ in puts}
        dels = [fp for fp in deletes if fp not in put_keys]
        if not puts and not dels:
            return

        def fn(txn: lmdb.Transaction) -> None:
            db = self._db("overrides")
            for fp in dels:
                txn.delete(fp, db=db)
            for fp, rec in puts:
                txn.put(fp, pack(rec), db=db)
        self._h.write(fn, what=f"storing {len(puts)} override(s)")

    def overrides_count(self) -> int:
        return self._entries("overrides")

    # --- audit ------------------------------------------------------------------------
    def audit_write(self, records: Sequence[tuple[int, dict[str, Any]]],
                    links: Sequence[tuple[bytes, dict[str, Any]]] = (), *,
                    max_entries: int = 0, max_age_s: float = 0.0,
                    now: float = 0.0) -> tuple[list[dict[str, Any] | None], int]:
        """Append audit records, attach outcomes, apply retention: one transaction.

        ``records``: (id, record). ``links``: (audit key, fields to add, e.g. ``outcome``
        and ``seq``); returns, per link, the record as it was before (None when the id is
        unknown or pruned) and the number of records pruned. Retention deletes (oldest
        first, at most :data:`PRUNE_CHUNK` per call) records older than ``max_age_s``
        (0: no age limit) and beyond ``max_entries`` (0: keep none).
        """
        def fn(txn: lmdb.Transaction) -> tuple[list[dict[str, Any] | None], int]:
            db = self._db("audit")
            for pid, rec in records:
                txn.put(u64(pid), pack(rec), db=db)
            found: list[dict[str, Any] | None] = []
            for key, extra in links:
                raw = txn.get(key, db=db)
                if raw is None:
                    found.append(None)
                    continue
                rec = unpack(raw)
                found.append(dict(rec))
                rec.update(extra)
                txn.put(key, pack(rec), db=db)
            return found, self._audit_prune(txn, db, max_entries, max_age_s, now)
        return self._h.write(fn, what=f"writing {len(records)} audit record(s)")

    @staticmethod
    def _audit_prune(txn: lmdb.Transaction, db: Any, max_entries: int, max_age_s: float,
                     now: float) -> int:
        excess = max(0, txn.stat(db)["entries"] - max(0, max_entries))
        cutoff = int((now - max_age_s) * 1e6) if max_age_s > 0 and now > 0 else 0
        cur = txn.cursor(db=db)
        pruned = 0
        if not cur.first():
            return 0
        while pruned < PRUNE_CHUNK:
            key = cur.key()
            if not key or (pruned >= excess and from_u64(key) >= cutoff):
                break
            if not cur.delete():  # deletes and moves to the next record
                break
            pruned += 1
        return pruned

    def audit_get(self, key: bytes) -> dict[str, Any] | None:
        def fn(txn: lmdb.Transaction) -> dict[str, Any] | None:
            db = self._h.db("audit")
            raw = txn.get(key, db=db) if db is not None else None
            return unpack(raw) if raw is not None else None
        return self._h.read(fn)

    def audit_last_id(self) -> int:
        """The newest audit id stored (0 when none): a restarted daemon issues ids above it."""
        def fn(txn: lmdb.Transaction) -> int:
            db = self._h.db("audit")
            if db is None:
                return 0
            cur = txn.cursor(db=db)
            return from_u64(cur.key()) if cur.last() else 0
        return self._h.read(fn)

    def audit_count(self) -> int:
        return self._entries("audit")

    def _entries(self, name: str) -> int:
        def fn(txn: lmdb.Transaction) -> int:
            db = self._h.db(name)
            return txn.stat(db)["entries"] if db is not None else 0
        return self._h.read(fn)


def read_audit(state_dir: str | os.PathLike[str], *, since: float = 0.0,
               tool: str | None = None, limit: int = 0) -> list[dict[str, Any]]:
    """Audit records of ``state_dir`` served at or after ``since`` (unix seconds), oldest
    first, optionally only those of ``tool``; the newest ``limit`` when ``limit`` > 0.

    Opens the state read-only (or uses this process's open environment): safe while the
    daemon runs. Each record has its ``prediction_id``.
    """
    h = current(state_dir)
    opened = h is None
    if h is None:
        h = acquire(state_dir, readonly=True)
    try:
        def fn(txn: lmdb.Transaction) -> list[dict[str, Any]]:
            db = h.db("audit")
            out: list[dict[str, Any]] = []
            if db is None:
                return out
            cur = txn.cursor(db=db)
            if not cur.set_range(u64(max(0, int(since * 1e6)))):
                return out
            for key, value in cur.iternext():
                rec = unpack(value)
                if rec.get("ts", 0.0) < since or (tool is not None and rec.get("tool") != tool):
                    continue
                out.append({"prediction_id": key_id(key), **rec})
            return out[-limit:] if limit > 0 else out
        return h.read(fn)
    finally:
        if opened:
            release(h)
