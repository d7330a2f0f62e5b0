"""The signal log: append-only, keyed by 8-byte big-endian sequence number (from 1).

One `append_signals` call is one write transaction: sequence numbers, the dedup index,
the false-positive/negative escalation counters and the label/weight decided for each
signal all commit together, and the call returns only after that commit. A caller that
acknowledges a signal after `append_signals` returned can never lose it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import lmdb

from ..signals import SignalError, escalation_key, label_and_weight, validate_signal
from .base import StoreBase
from .codec import from_u64, pack, u64, unpack

log = logging.getLogger("gated.store")

_PRUNE_CHUNK = 5000


def encode_record(sig: Mapping[str, Any], label: float, weight: float, received: float) -> bytes:
    """Stored form of a normalised signal: absent optional fields are left out."""
    rec: dict[str, Any] = {"context": sig["context"], "decision": sig["decision"],
                           "label": label, "weight": weight, "rt": received}
    if sig.get("history"):
        rec["history"] = list(sig["history"])
    for key in ("feedback", "reason", "id", "ts", "prediction_id"):
        if sig.get(key) is not None:
            rec[key] = sig[key]
    if sig.get("served") is not None:  # set by the daemon, never by a client (`ServedDeep`)
        rec["sd"] = [int(sig["served"][0]), float(sig["served"][1])]
    return pack(rec)


def decode_record(data: bytes | memoryview) -> dict[str, Any]:
    """A stored signal with every key present: the signal fields, label, weight, received,
    and `served`: (transformer token, its logit) of the prediction serving answered for
    this call before the signal came, or None (`ServedDeep`)."""
    rec = unpack(data)
    sd = rec.get("sd")
    return {"context": rec["context"], "history": rec.get("history") or [],
            "decision": rec["decision"], "feedback": rec.get("feedback"),
            "reason": rec.get("reason"), "id": rec.get("id"), "ts": rec.get("ts"),
            "prediction_id": rec.get("prediction_id"), "label": rec["label"],
            "weight": rec["weight"], "received": rec.get("rt"),
            "served": (int(sd[0]), float(sd[1])) if sd else None}


class SignalLog(StoreBase):
    """Append, read, count and prune the signal log; the escalation counters."""

    def append_signals(self, signals: Sequence[Mapping[str, Any]], *,
                       validated: bool = False) -> list[tuple[int, bool]]:
        """Store signals in ONE committed transaction; returns ``(seq, duplicate)`` per signal.

        Every signal is validated first (skipped with ``validated=True`` when they come out
        of `validate_signal` already); an invalid one raises `SignalError` (with ``index``)
        and nothing is written. A signal whose ``id`` is already stored -- earlier, or
        earlier in this same batch -- is not stored again: it gets the original sequence
        number and ``duplicate=True``. Raises `StoreFullError` / `StoreError` when the
        commit fails; then nothing of this batch was stored.
        """
        if validated:
            sigs = list(signals)
        else:
            sigs = []
            for i, s in enumerate(signals):
                try:
                    sigs.append(validate_signal(s))
                except SignalError as e:
                    raise SignalError(e.code, f"signal #{i}: {e.message}", index=i) from None
        if not sigs:
            return []
        table = self.weights
        received = time.time()
        # Everything that needs no database is computed outside the write lock.
        prepared = [(s, s["id"].encode() if s.get("id") else None, escalation_key(s, table))
                    for s in sigs]

        def txn_fn(txn: lmdb.Transaction) -> list[tuple[int, bool]]:
            sig_db, dedup_db, fp_db = self._db("signals"), self._db("dedup"), self._db(
                "fingerprints")
            last = self._last_seq_txn(txn)
            out: list[tuple[int, bool]] = []
            get, put = txn.get, txn.put  # bound once: this loop runs per signal
            for sig, sid, ekey in prepared:
                if sid is not None:
                    prev = get(sid, db=dedup_db)
                    if prev is not None:
                        out.append((from_u64(prev), True))
                        continue
                prior = 0
                if ekey is not None:
                    raw = get(ekey, db=fp_db)
                    prior = from_u64(raw) if raw is not None else 0
                    put(ekey, u64(prior + 1), db=fp_db)
                label, weight = label_and_weight(sig, prior, table)
                last += 1
                key = u64(last)
                if not put(key, encode_record(sig, label, weight, received), db=sig_db,
                           append=True):
                    raise lmdb.CorruptedError(f"signal log key {last} already exists")
                if sid is not None:
                    put(sid, key, db=dedup_db)
                out.append((last, False))
            self._meta_put_int(txn, b"last_seq", last)
            return out

        return self._h.write(txn_fn, what=f"appending {len(sigs)} signal(s)")

    def _last_seq_txn(self, txn: lmdb.Transaction) -> int:
        last = self._meta_int(txn, b"last_seq", -1)
        if last >= 0:
            return last
        db = self._h.db("signals")
        if db is None:
            return 0
        cur = txn.cursor(db=db)
        return from_u64(cur.key()) if cur.last() else 0

    def last_seq(self) -> int:
        """The highest sequence number ever assigned (0 when none); pruning keeps it."""
        return self._h.read(self._last_seq_txn)

    def first_seq(self) -> int:
        """The lowest sequence number still in the log (0 when the log is empty)."""
        def fn(txn: lmdb.Transaction) -> int:
            db = self._h.db("signals")
            if db is None:
                return 0
            cur = txn.cursor(db=db)
            return from_u64(cur.key()) if cur.first() else 0
        return self._h.read(fn)

    def count_signals(self) -> int:
        """Signals currently in the log (after retention)."""
        def fn(txn: lmdb.Transaction) -> int:
            db = self._h.db("signals")
            return txn.stat(db)["entries"] if db is not None else 0
        return self._h.read(fn)

    def read_signals(self, after_seq: int, limit: int) -> list[tuple[int, dict[str, Any]]]:
        """Up to ``limit`` signals with seq > ``after_seq``, in order, as ``(seq, signal)``.

        Each signal dict has the normalised signal keys plus ``label`` and ``weight`` (as
        decided at ingest) and ``received`` (unix seconds of the commit).
        """
        if limit <= 0:
            return []

        def fn(txn: lmdb.Transaction) -> list[tuple[int, dict[str, Any]]]:
            db = self._h.db("signals")
            if db is None:
                return []
            cur = txn.cursor(db=db)
            out: list[tuple[int, dict[str, Any]]] = []
            if not cur.set_range(u64(max(after_seq, 0) + 1)):
                return out
            for key, value in cur:
                out.append((from_u64(key), decode_record(value)))
                if len(out) >= limit:
                    break
            return out
        return self._h.read(fn)

    def lookup_id(self, signal_id: str) -> int | None:
        """The sequence number stored for a client ``id``, if it is (still) known."""
        def fn(txn: lmdb.Transaction) -> int | None:
            db = self._h.db("dedup")
            raw = txn.get(signal_id.encode(), db=db) if db is not None else None
            return from_u64(raw) if raw is not None else None
        return self._h.read(fn)

    def escalation(self, context: str, feedback: str = "false_positive",
                   history: Iterable[str] | None = None) -> int:
        """How many ``feedback`` corrections (false_positive / false_negative) are counted
        for this context fingerprint; the next one gets weight ``escalation[count]``."""
        key = escalation_key({"context": context, "history": list(history or []),
                              "feedback": feedback}, self.weights)
        if key is None:
            raise ValueError("escalation is counted for false_positive and false_negative only")

        def fn(txn: lmdb.Transaction) -> int:
            db = self._h.db("fingerprints")
            raw = txn.get(key, db=db) if db is not None else None
            return from_u64(raw) if raw is not None else 0
        return self._h.read(fn)

    # --- retention ----------------------------------------------------------------------------
    def prune(self, max_age_s: float | None = None, max_count: int | None = None,
              upto_seq: int | None = None, *, now: float | None = None) -> int:
        """Delete old *trained* signals; returns how many were deleted.

        A signal goes when it is older than ``max_age_s`` (by commit time) or when more
        than ``max_count`` signals would otherwise remain, oldest first -- but never past
        ``upto_seq``, and never past the last trained sequence number of the committed
        checkpoint (a signal after it would be re-trained on restart, so it must stay),
        whichever is lower. Dedup entries of pruned signals go with them: an id re-sent
        after its signal was pruned is stored as new.
        """
        if max_age_s is None and max_count is None:
            return 0
        now = time.time() if now is None else now
        cutoff = None if max_age_s is None else now - max_age_s
        total = 0
        while True:
            def fn(txn: lmdb.Transaction) -> tuple[int, bool]:
                bound = self._meta_int(txn, b"last_trained_seq", 0)
                if upto_seq is not None:
                    bound = min(bound, upto_seq)
                sig_db, dedup_db = self._db("signals"), self._db("dedup")
                remaining = txn.stat(sig_db)["entries"]
                cur = txn.cursor(db=sig_db)
                deleted = 0
                more = cur.first()
                while more and deleted < _PRUNE_CHUNK:
                    seq = from_u64(cur.key())
                    if seq > bound:
                        return deleted, False
                    over_count = max_count is not None and remaining - deleted > max_count
                    if not over_count:
                        rec = unpack(cur.value())
                        if cutoff is None or rec.get("rt", now) >= cutoff:
                            return deleted, False
                    else:
                        rec = unpack(cur.value())
                    sid = rec.get("id")
                    if sid is not None:
                        key = sid.encode()
                        raw = txn.get(key, db=dedup_db)
                        if raw is not None and from_u64(raw) == seq:
                            txn.delete(key, db=dedup_db)
                    cur.delete()  # moves to the next entry, if any
                    more = cur.key() != b""
                    deleted += 1
                return deleted, bool(more)

            deleted, more = self._h.write(fn, what="pruning trained signals")
            total += deleted
            if not more or deleted == 0:
                break
        if total:
            log.info("retention pruned %d trained signal(s)", total)
        return total
