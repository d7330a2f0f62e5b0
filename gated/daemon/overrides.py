"""The override memory: a person's corrections, remembered by the fingerprint of the call
they correct, until they expire (TTL, the model agrees, or the memory is full).

It lives apart from trust.py because it stands alone: it is given a function that
persists its changes and knows nothing of the store, the writer thread or the server.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("gated.trust")


@dataclass
class Override:
    """One remembered correction: its label (1 allow, 0 block), the feedback, when (unix
    seconds), the signal's sequence number and tool. ``checked_version`` is the serving
    version whose opinion was last asked (memory only)."""

    label: int
    feedback: str
    ts: float
    seq: int
    tool: str
    checked_version: int = -1

    def record(self) -> dict[str, Any]:
        return {"label": self.label, "feedback": self.feedback, "ts": self.ts,
                "seq": self.seq, "tool": self.tool}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Override:
        return cls(int(rec["label"]), str(rec.get("feedback", "")), float(rec["ts"]),
                   int(rec.get("seq", 0)), str(rec.get("tool", "")))


Persist = Callable[[list[tuple[bytes, dict[str, Any]]], list[bytes]], Future]


class OverrideMemory:
    """The override memory: fingerprint -> :class:`Override`, oldest first; thread-safe.

    ``persist(puts, deletes)`` writes a change to LMDB and returns a Future (the daemon's
    :class:`TrustWriter`); ``on_expire(reason, n)`` counts expiries (``ttl``,
    ``agreed``, ``evicted``).
    """

    def __init__(self, *, max_entries: int, ttl_s: float, agree_margin: float,
                 persist: Persist, on_expire: Callable[[str, int], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.max_entries, self.ttl_s, self.agree_margin = max_entries, ttl_s, agree_margin
        self._persist = persist
        self._on_expire = on_expire or (lambda reason, n: None)
        self._clock = clock
        self._d: OrderedDict[bytes, Override] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0

    def __len__(self) -> int:
        return len(self._d)

    def load(self, items: Sequence[tuple[bytes, dict[str, Any]]]) -> None:
        """Fill from the store at start: expired entries are deleted, the newest
        ``max_entries`` kept."""
        now = self._clock()
        entries = sorted(((fp, Override.from_record(rec)) for fp, rec in items),
                         key=lambda e: e[1].ts)
        stale = [fp for fp, ov in entries if now - ov.ts >= self.ttl_s]
        with self._lock:
            for fp, ov in entries:
                if now - ov.ts < self.ttl_s:
                    self._d[fp] = ov
            evicted = self._trim()
        self._gone("ttl", stale)
        self._gone("evicted", evicted)

    def configure(self, *, max_entries: int, ttl_s: float, agree_margin: float) -> None:
        """Hot reload: a smaller ``max_entries`` drops the oldest at once; a shorter TTL
        applies at the next lookup or sweep."""
        with self._lock:
            self.max_entries, self.ttl_s, self.agree_margin = max_entries, ttl_s, agree_margin
            evicted = self._trim()
        self._gone("evicted", evicted)

    def lookup(self, fp: bytes) -> Override | None:
        """The live override of ``fp`` (an expired one is removed), counted as a hit."""
        with self._lock:
            ov = self._d.get(fp)
            if ov is None:
                return None
            if self._clock() - ov.ts >= self.ttl_s:
                del self._d[fp]
                expired = True
            else:
                self.hits += 1
                expired = False
        if expired:
            self._gone("ttl", [fp])
            return None
        return ov

    def get(self, fp: bytes) -> Override | None:
        """The entry of ``fp``, expired or not, without counting (tests, status)."""
        with self._lock:
            return self._d.get(fp)

    def remember(self, items: Sequence[tuple[bytes, Override]]) -> Future | None:
        """Corrections just acknowledged, in order (a newer one for the same fingerprint
        replaces the older); returns the Future of their commit (None: memory off)."""
        if self.max_entries <= 0 or not items:
            return None
        with self._lock:
            for fp, ov in items:
                self._d.pop(fp, None)
                self._d[fp] = ov
            evicted = self._trim()
            puts = [(fp, ov.record()) for fp, ov in dict(items).items() if fp in self._d]
        if evicted:
            self._on_expire("evicted", len(evicted))
        return self._persist(puts, evicted)

    def agrees(self, ov: Override, p_allow: float) -> bool:
        """Whether the model's ``p_allow`` agrees with the override by the margin."""
        if ov.label:
            return p_allow >= 0.5 + self.agree_margin
        return p_allow <= 0.5 - self.agree_margin

    def observe_model(self, fp: bytes, ov: Override, p_allow: float, version: int) -> bool:
        """The serving model's answer for an override's call: when it agrees by the
        margin the override has done its job and expires (True). ``ov`` must still be the
        entry of ``fp`` (a newer correction in between is not expired by an old answer)."""
        with self._lock:
            if self._d.get(fp) is not ov:
                return False
            ov.checked_version = max(ov.checked_version, version)
            if not self.agrees(ov, p_allow):
                return False
            del self._d[fp]
        log.info("override of %s (%s, seq %d) expired: the model agrees (p_allow %.3f, "
                 "version %d)", ov.tool or "?", ov.feedback, ov.seq, p_allow, version)
        self._gone("agreed", [fp])
        return True

    def sweep(self) -> int:
        """Remove every override past its TTL; returns how many."""
        now = self._clock()
        with self._lock:
            stale = [fp for fp, ov in self._d.items() if now - ov.ts >= self.ttl_s]
            for fp in stale:
                del self._d[fp]
        self._gone("ttl", stale)
        return len(stale)

    def _trim(self) -> list[bytes]:
        evicted = []
        while len(self._d) > max(0, self.max_entries):
            fp, _ = self._d.popitem(last=False)
            evicted.append(fp)
        return evicted

    def _gone(self, reason: str, fps: list[bytes]) -> None:
        if fps:
            self._on_expire(reason, len(fps))
            self._persist([], fps)
