"""The durable replay reservoir of past training examples.

Two key ranges in the ``replay`` database, both dense:
``b"u" + u32`` unlocked slots (reservoir sampling, Vitter's algorithm R, over every
unlocked example ever offered) and ``b"l" + u64`` locked slots (false-positive and
false-negative examples: a person said the gate was wrong, so the model must never stop
rehearsing them). Counters live under ``b"#..."`` keys of the same database, updated in the
same transaction as the slots.

A newer example for the same (context, history) fingerprint SUPERSEDES the stored one
(DESIGN.md section 2), through the index ``b"f" + fingerprint`` -> slot key: a
correction relabels it (an ordinary example becomes a locked one), a newer decision
relabels an ordinary example in place, and a newer decision that contradicts a locked
example unlocks it. So no stale label of a call is ever replayed. After a detected
policy change the trainer calls `reservoir_forget_before` to drop the ordinary examples
labelled under the old policy (each record keeps its signal's sequence number).

Capacity is shared: a locked example that arrives when every slot is taken evicts a random
unlocked one. When *all* slots are locked, locked examples are still kept -- the reservoir
grows past its capacity, by at most one example per human correction -- and unlocked
examples are no longer kept; a warning asks the operator to raise ``replay_slots``.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import lmdb

from ..signals import ESCALATING
from .base import StoreBase
from .codec import from_u64, pack, u64, unpack

log = logging.getLogger("gated.store")

_U32 = struct.Struct(">I")
_NU, _NL, _SEEN, _MAXSEQ = b"#nu", b"#nl", b"#seen", b"#maxseq"


def _ukey(i: int) -> bytes:
    return b"u" + _U32.pack(i)


def _lkey(i: int) -> bytes:
    return b"l" + u64(i)


def randbelow(rng: Any, n: int) -> int:
    """A uniform int in [0, n) from `random.Random` or a NumPy Generator."""
    if hasattr(rng, "randrange"):
        return rng.randrange(n)
    return int(rng.integers(n))


def _sample_indices(rng: Any, total: int, k: int) -> list[int]:
    if hasattr(rng, "sample"):
        return rng.sample(range(total), k)
    return [int(i) for i in rng.choice(total, size=k, replace=False)]


def _rng_state(rng: Any) -> Any:
    if hasattr(rng, "getstate"):
        return rng.getstate()
    if hasattr(rng, "bit_generator"):
        return rng.bit_generator.state
    return None


def _rng_restore(rng: Any, state: Any) -> None:
    """A retried transaction (map grown) must draw the same numbers: seeded runs stay
    reproducible."""
    if state is None:
        return
    if hasattr(rng, "setstate"):
        rng.setstate(state)
    else:
        rng.bit_generator.state = state


def _index_key(fp: bytes) -> bytes:
    return b"f" + fp


def is_locked(example: Mapping[str, Any]) -> bool:
    locked = example.get("locked")
    if locked is not None:
        return bool(locked)
    return example.get("feedback") in ESCALATING


def _record(ex: Mapping[str, Any], locked: bool) -> bytes:
    rec: dict[str, Any] = {"context": ex["context"], "label": float(ex["label"]),
                           "weight": float(ex.get("weight", 1.0))}
    if ex.get("history"):
        rec["history"] = list(ex["history"])
    if ex.get("reason") is not None:
        rec["reason"] = ex["reason"]
    if ex.get("feedback") is not None:
        rec["feedback"] = ex["feedback"]
    if locked:
        rec["locked"] = True
    if ex.get("fp") is not None:
        rec["fp"] = bytes(ex["fp"])
    if ex.get("seq") is not None:
        rec["seq"] = int(ex["seq"])
    return pack(rec)


def _example(data: bytes | memoryview) -> dict[str, Any]:
    rec = unpack(data)
    return {"context": rec["context"], "history": rec.get("history") or [],
            "reason": rec.get("reason"), "label": rec["label"], "weight": rec["weight"],
            "feedback": rec.get("feedback"), "locked": bool(rec.get("locked", False)),
            "seq": rec.get("seq"), "fp": rec.get("fp")}


class Reservoir(StoreBase):
    """`reservoir_add`, `reservoir_sample`, `reservoir_size`, `reservoir_stats`."""

    _warned_all_locked = False

    def _counters(self, txn: lmdb.Transaction) -> tuple[int, int, int]:
        db = self._h.db("replay")
        if db is None:
            return 0, 0, 0
        vals = [txn.get(k, db=db) for k in (_NU, _NL, _SEEN)]
        nu, nl, seen = (from_u64(v) if v is not None else 0 for v in vals)
        return nu, nl, seen

    # --- dense slot ranges with a fingerprint index (all inside one write transaction) ---
    def _put(self, txn: lmdb.Transaction, key: bytes, data: bytes) -> None:
        """Write a slot and point its record's fingerprint at it; the record it replaces
        loses its index entry."""
        db = self._db("replay")
        old = txn.get(key, db=db)
        if old is not None:
            self._unindex(txn, key, unpack(old).get("fp"))
        txn.put(key, data, db=db)
        fp = unpack(data).get("fp")
        if fp is not None:
            txn.put(_index_key(fp), key, db=db)

    def _unindex(self, txn: lmdb.Transaction, key: bytes, fp: bytes | None) -> None:
        db = self._db("replay")
        if fp is not None and txn.get(_index_key(fp), db=db) == key:
            txn.delete(_index_key(fp), db=db)

    def _remove(self, txn: lmdb.Transaction, key: bytes, nu: int, nl: int) -> tuple[int, int]:
        """Remove one slot, moving the last slot of its range into the hole; returns the
        new (nu, nl)."""
        db = self._db("replay")
        locked = key[:1] == b"l"
        last = _lkey(nl - 1) if locked else _ukey(nu - 1)
        self._unindex(txn, key, unpack(txn.get(key, db=db)).get("fp"))
        if key != last:
            moved = txn.get(last, db=db)
            self._unindex(txn, last, unpack(moved).get("fp"))
            self._put(txn, key, bytes(moved))
        txn.delete(last, db=db)
        return (nu, nl - 1) if locked else (nu - 1, nl)

    def _supersede(self, txn: lmdb.Transaction, locked: bool, ex: Mapping[str, Any],
                   nu: int, nl: int) -> tuple[bool, int, int]:
        """Apply a newer example to the stored one of the same fingerprint, if any.

        Returns (done, nu, nl): done when the example took the old one's slot (or was
        absorbed by an agreeing locked one); otherwise the caller stores it as new."""
        fp = ex.get("fp")
        if fp is None:
            return False, nu, nl
        db = self._db("replay")
        key = txn.get(_index_key(fp), db=db)
        if key is None:
            return False, nu, nl
        key = bytes(key)
        old_locked = key[:1] == b"l"
        if old_locked == locked:  # same kind: relabel in place
            self._put(txn, key, _record(ex, locked))
            return True, nu, nl
        if old_locked and float(unpack(txn.get(key, db=db))["label"]) == float(ex["label"]):
            return True, nu, nl  # a newer decision agrees with the correction: keep it locked
        # A correction of an ordinary example, or a newer decision contradicting a locked
        # one: take the old slot out; the caller stores the new example in its own range.
        nu, nl = self._remove(txn, key, nu, nl)
        return False, nu, nl

    def reservoir_add(self, examples: Sequence[Mapping[str, Any]], rng: Any) -> int:
        """Offer training examples to the reservoir (one transaction); returns how many
        were stored. Examples are dicts with context, history, reason, label, weight and
        feedback (or an explicit ``locked``); fp/fn examples are locked.

        An example may carry ``seq``, the sequence number of its signal: one at or below
        the highest seq already offered is skipped, so signals re-trained after a restart
        (those after the last checkpoint) do not enter the reservoir twice.
        """
        if not examples:
            return 0
        cap = self.replay_slots
        state = _rng_state(rng)
        records = [(is_locked(ex), ex) for ex in examples]

        def fn(txn: lmdb.Transaction) -> tuple[int, bool]:
            _rng_restore(rng, state)
            db = self._db("replay")
            nu, nl, seen = self._counters(txn)
            raw = txn.get(_MAXSEQ, db=db)
            max_seq = from_u64(raw) if raw is not None else 0
            stored, saturated = 0, False
            for locked, ex in records:
                seq = ex.get("seq")
                if seq is not None:
                    if seq <= max_seq:
                        continue  # offered before a restart re-trained it: not twice
                    max_seq = seq
                done, nu, nl = self._supersede(txn, locked, ex, nu, nl)
                if done:
                    stored += 1
                    continue
                if locked:
                    if nu + nl >= cap and nu > 0:  # evict a random unlocked example
                        nu, nl = self._remove(txn, _ukey(randbelow(rng, nu)), nu, nl)
                    elif nu + nl >= cap:
                        saturated = True
                    self._put(txn, _lkey(nl), _record(ex, True))
                    nl += 1
                    stored += 1
                    continue
                seen += 1
                room = cap - nl
                if room <= 0:
                    saturated = True
                    continue
                if nu < room:
                    self._put(txn, _ukey(nu), _record(ex, False))
                    nu += 1
                    stored += 1
                else:
                    j = randbelow(rng, seen)
                    if j < nu:
                        self._put(txn, _ukey(j), _record(ex, False))
                        stored += 1
            txn.put(_NU, u64(nu), db=db)
            txn.put(_NL, u64(nl), db=db)
            txn.put(_SEEN, u64(seen), db=db)
            txn.put(_MAXSEQ, u64(max_seq), db=db)
            return stored, saturated

        stored, saturated = self._write_with_metrics(
            fn, what=f"adding {len(examples)} replay example(s)")
        if saturated and not self._warned_all_locked:
            self._warned_all_locked = True
            log.warning("replay reservoir: all %d slots hold locked false-positive/negative "
                        "examples; locked examples are still kept (the reservoir grows past "
                        "its capacity) but new ordinary examples are not; raise replay_slots",
                        cap)
        return stored

    def reservoir_forget_before(self, seq: int) -> int:
        """Drop the ordinary (unlocked) examples of signals before `seq` -- labelled under a
        policy that a detected drift says has changed -- in one transaction. Locked
        corrections stay. Reservoir sampling restarts over what is kept, so the sample
        stays uniform over the signals since `seq`. Returns how many were dropped."""

        def fn(txn: lmdb.Transaction) -> int:
            db = self._db("replay")
            nu, nl, _ = self._counters(txn)
            kept = []
            for i in range(nu):
                raw = bytes(txn.get(_ukey(i), db=db))
                rec = unpack(raw)
                self._unindex(txn, _ukey(i), rec.get("fp"))
                txn.delete(_ukey(i), db=db)
                if rec.get("seq") is not None and rec["seq"] >= seq:
                    kept.append(raw)
            for i, raw in enumerate(kept):
                self._put(txn, _ukey(i), raw)
            txn.put(_NU, u64(len(kept)), db=db)
            txn.put(_SEEN, u64(len(kept)), db=db)
            return nu - len(kept)

        return self._write_with_metrics(fn, what=f"dropping replay examples before seq {seq}")

    def reservoir_sample(self, n: int, rng: Any) -> list[dict[str, Any]]:
        """Up to ``n`` distinct examples drawn uniformly (locked and unlocked alike) with
        ``rng`` (`random.Random` or a NumPy Generator): the same seed gives the same draw."""
        if n <= 0:
            return []

        def fn(txn: lmdb.Transaction) -> list[dict[str, Any]]:
            db = self._h.db("replay")
            if db is None:
                return []
            nu, nl, _ = self._counters(txn)
            total = nu + nl
            if total == 0:
                return []
            picks = _sample_indices(rng, total, min(n, total))
            out = []
            for i in picks:
                raw = txn.get(_ukey(i) if i < nu else _lkey(i - nu), db=db)
                if raw is None:  # pragma: no cover - counters and slots commit together
                    raise lmdb.CorruptedError(f"replay slot {i} missing")
                out.append(_example(raw))
            return out
        return self._h.read(fn)

    def reservoir_size(self) -> int:
        """Examples held (locked ones included)."""
        nu, nl, _ = self._h.read(self._counters)
        return nu + nl

    def reservoir_stats(self) -> dict[str, int]:
        nu, nl, seen = self._h.read(self._counters)
        return {"size": nu + nl, "locked": nl, "unlocked": nu, "seen_unlocked": seen,
                "capacity": self.replay_slots}
