"""Trust: what answers a prediction besides the model, and the record of what was served.

A ``predict`` (or ``explain``) is answered by the first of:

1. **an operator rule** (``[rules]``, gated/rules.py): ``source: "rule"``;
2. **the override memory**: a person's correction (``override_allow``, ``override_block``,
   ``false_positive``, ``false_negative``) of this exact (context, history) fingerprint is
   honoured from the next request on, before the model has learned it: ``source:
   "override"``. It expires when the serving model agrees with it by
   ``overrides.agree_margin``, or ``overrides.ttl_s`` after the correction;
3. **the model** (the prediction cache, then the micro-batcher): ``source: "model"``.

Every reply carries a ``prediction_id`` and is written to the audit log (LMDB, by a
background thread, so a reply never waits for a disk and a full disk never fails a
prediction: dropped records are counted and logged). A later signal that carries the
``prediction_id`` links its outcome to the served prediction: the record gets the
outcome, and the served alignment (``gated_served_alignment``) counts whether the served
answer (p_allow >= 0.5) agreed with the signal's label.

The override memory (overrides.py) lives in memory (thread-safe) and in the ``overrides``
database; the memory is changed in the event loop before the signal's reply, the database
by the writer thread, and the reply waits for that commit, so an acknowledged correction
is honoured after a restart too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from ..rules import RuleSet, tool_of
from ..signals import CORRECTIONS, context_fingerprint, label_and_weight
from ..store.trust import id_key
from .overrides import Override, OverrideMemory
from .serving import PredictionCache

log = logging.getLogger("gated.trust")

#: The writer commits the audit records queued over this long in one transaction.
AUDIT_FLUSH_S = 0.1
#: With no traffic, retention still runs this often (seconds).
AUDIT_PRUNE_EVERY_S = 30.0
#: Served predictions remembered in memory for linking when their record could not be
#: written (full disk, audit.max_entries = 0).
RECENT_PREDICTIONS = 16384
#: Dropped audit records are logged at most this often (seconds).
DROP_LOG_EVERY_S = 60.0
#: Bytes of the tool name kept in an audit record.
TOOL_BYTES = 128

SOURCES = ("rule", "override", "model")
BANDS = ("allow", "ask", "block")


class PredictionIds:
    """Prediction ids: strictly increasing 64-bit numbers, at least the wall clock in
    microseconds (so they sort by time, survive restarts and key the audit log), shown as
    16 hex digits."""

    def __init__(self, floor: int = 0) -> None:
        self._last = floor
        self._lock = threading.Lock()

    def next(self) -> int:
        now = time.time_ns() // 1000
        with self._lock:
            self._last = max(self._last + 1, now)
            return self._last


def format_id(pid: int) -> str:
    return f"{pid:016x}"


class ServedAlignment:
    """Agreement of served predictions with the labels of the signals that referenced
    them: a window of the last ``window`` outcomes, and counts."""

    def __init__(self, window: int) -> None:
        self.window: deque[bool] = deque(maxlen=max(1, window))
        self.agreed = 0  # in the window
        self.linked = self.unlinked = 0

    def add(self, agree: bool) -> float:
        if len(self.window) == self.window.maxlen and self.window[0]:
            self.agreed -= 1
        self.window.append(agree)
        self.agreed += agree
        self.linked += 1
        return self.value

    @property
    def value(self) -> float:
        return self.agreed / len(self.window) if self.window else 0.0


class TrustWriter:
    """The daemon's writer of the trust state: override changes (a Future each, committed
    at once) and audit records and outcome links (batched over :data:`AUDIT_FLUSH_S`, one
    transaction per batch, retention in the same transaction). One thread.

    A failed audit commit (full disk, full map) drops its records: counted, logged at
    most once a minute; predictions go on. ``metrics`` is the daemon's Metrics (or None).
    """

    def __init__(self, store: Any, *, queue_max: int, max_entries: int, max_age_s: float,
                 window: int, metrics: Any = None) -> None:
        self.store, self.queue_max, self.metrics = store, queue_max, metrics
        self.max_entries, self.max_age_s = max_entries, max_age_s
        self.alignment = ServedAlignment(window)
        self.written = self.dropped = 0
        self._ops: list[tuple[list, list, Future]] = []
        self._records: deque[tuple[int, dict[str, Any]]] = deque()
        self._links: list[tuple[str, float, int]] = []
        self._first_at = 0.0
        self._cond = threading.Condition()
        self._closing = False
        self._recent: OrderedDict[int, tuple[str, str, float]] = OrderedDict()
        self._dropped_logged_at = 0.0
        self._dropped_since_log = 0
        self._pruned_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="gated-trust", daemon=True)
        self._thread.start()

    # --- producers (any thread) ------------------------------------------------------------
    def overrides(self, puts: list[tuple[bytes, dict[str, Any]]],
                  deletes: list[bytes]) -> Future:
        fut: Future = Future()
        with self._cond:
            if self._closing:
                fut.set_result(False)
                return fut
            self._ops.append((puts, deletes, fut))
            self._cond.notify()
        return fut

    def audit(self, pid: int, record: dict[str, Any]) -> bool:
        """Queue one audit record; False (dropped, counted) when the queue is full."""
        with self._cond:
            if len(self._records) < self.queue_max and not self._closing:
                if not self._records and not self._links:
                    self._first_at = time.monotonic()
                self._records.append((pid, record))
                self._cond.notify()
                return True
        self._drop(1, "the audit queue is full (audit.queue_max)")
        return False

    def link(self, prediction_id: str, label: float, seq: int) -> None:
        """A stored signal referenced ``prediction_id``: attach its outcome, count it."""
        with self._cond:
            if self._closing:
                return
            if not self._records and not self._links:
                self._first_at = time.monotonic()
            self._links.append((prediction_id, label, seq))
            self._cond.notify()

    def retention(self, max_entries: int, max_age_s: float) -> None:
        self.max_entries, self.max_age_s = max_entries, max_age_s

    @property
    def pending(self) -> int:
        return len(self._records)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, then stop."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    # --- the thread ------------------------------------------------------------------------
    def _take(self) -> tuple[list, list, list, bool] | None:
        with self._cond:
            while True:
                if self._ops or self._closing:
                    break
                if self._records or self._links:
                    left = self._first_at + AUDIT_FLUSH_S - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                    continue
                if not self._cond.wait(AUDIT_PRUNE_EVERY_S):
                    break  # idle: a retention pass
            ops, self._ops = self._ops, []
            records = list(self._records)
            self._records.clear()
            links, self._links = self._links, []
            done = self._closing and not ops and not records and not links
            return None if done else (ops, records, links, self._closing)

    def _run(self) -> None:
        while True:
            got = self._take()
            if got is None:
                return
            ops, records, links, _ = got
            if ops:
                try:
                    self._write_overrides(ops)
                except Exception:  # noqa: BLE001 - never leave a signal's reply waiting
                    log.exception("the override writer failed")
                    for _, _, fut in ops:
                        if not fut.done():
                            fut.set_result(False)
            try:
                self._write_audit(records, links)
            except Exception:  # noqa: BLE001 - the writer must outlive any one failure
                log.exception("the audit writer failed; %d record(s) dropped", len(records))

    def _write_overrides(self, ops: list[tuple[list, list, Future]]) -> None:
        puts: dict[bytes, dict[str, Any]] = {}
        deletes: set[bytes] = set()
        for p, d, _ in ops:  # in order: a later put or delete wins
            for fp in d:
                puts.pop(fp, None)
                deletes.add(fp)
            for fp, rec in p:
                deletes.discard(fp)
                puts[fp] = rec
        ok = True
        try:
            self.store.overrides_apply(list(puts.items()), sorted(deletes))
        except Exception as e:  # noqa: BLE001 - served from memory meanwhile
            ok = False
            log.error("storing the override memory failed (%s); %d correction(s) are "
                      "honoured from memory until a restart", e, len(puts))
        for _, _, fut in ops:
            fut.set_result(ok)

    def _write_audit(self, records: list[tuple[int, dict[str, Any]]],
                     links: list[tuple[str, float, int]]) -> None:
        for pid, rec in records:
            self._recent[pid] = (rec["source"], rec["band"], rec["p_allow"])
        while len(self._recent) > RECENT_PREDICTIONS:
            self._recent.popitem(last=False)
        keyed = [(key, pid, label, seq) for pid, label, seq in links
                 if (key := id_key(pid)) is not None]
        unlinked = len(links) - len(keyed)  # not one of our ids
        now = time.monotonic()
        if not records and not keyed and now - self._pruned_at < AUDIT_PRUNE_EVERY_S:
            self._count_unlinked(unlinked)
            return
        self._pruned_at = now
        to_write = records if self.max_entries > 0 else []
        link_args = [(key, {"outcome": "allow" if label >= 0.5 else "block", "seq": seq})
                     for key, _, label, seq in keyed]
        try:
            found, _ = self.store.audit_write(to_write, link_args,
                                              max_entries=self.max_entries,
                                              max_age_s=self.max_age_s, now=time.time())
        except Exception as e:  # noqa: BLE001 - a full disk never fails a prediction
            found = [None] * len(keyed)
            if to_write:
                self._drop(len(to_write), f"writing the audit log failed: {e}")
        else:
            if to_write:
                self.written += len(to_write)
                if self.metrics is not None:
                    self.metrics.audit_records.inc(len(to_write))
        for (key, _, label, _), rec in zip(keyed, found, strict=True):
            served = self._recent.get(int.from_bytes(key, "big"))
            if served is None and rec is not None:
                served = (rec.get("source", "model"), rec.get("band", "ask"),
                          float(rec.get("p_allow", 0.5)))
            if served is None:  # unknown, pruned, or its record was dropped long ago
                unlinked += 1
                continue
            self._outcome(*served, label)
        self._count_unlinked(unlinked)

    def _outcome(self, source: str, band: str, p_allow: float, label: float) -> None:
        agree = (p_allow >= 0.5) == (label >= 0.5)
        value = self.alignment.add(agree)
        if self.metrics is not None:
            self.metrics.served_outcome(source, band, agree, value, len(self.alignment.window))

    def _count_unlinked(self, n: int) -> None:
        if n:
            self.alignment.unlinked += n
            if self.metrics is not None:
                self.metrics.served_unlinked.inc(n)

    def _drop(self, n: int, why: str) -> None:
        self.dropped += n
        self._dropped_since_log += n
        if self.metrics is not None:
            self.metrics.audit_dropped.inc(n)
        now = time.monotonic()
        if now - self._dropped_logged_at >= DROP_LOG_EVERY_S:
            log.warning("%d audit record(s) dropped (%s); predictions are not affected",
                        self._dropped_since_log, why)
            self._dropped_logged_at = now
            self._dropped_since_log = 0


class Trust:
    """What the server asks before and after the model (see the module doc)."""

    def __init__(self, cfg: Any, store: Any, serving: Any, batcher: Any,
                 metrics: Any = None) -> None:
        self.serving, self.batcher, self.metrics = serving, batcher, metrics
        self.rules = RuleSet.from_config(cfg.rules)
        self.ids = PredictionIds(store.audit_last_id())
        a, o = cfg.audit, cfg.overrides
        self.writer = TrustWriter(store, queue_max=a.queue_max, max_entries=a.max_entries,
                                  max_age_s=a.max_age_s, window=a.alignment_window,
                                  metrics=metrics)
        self.overrides = OverrideMemory(
            max_entries=o.max_entries, ttl_s=o.ttl_s, agree_margin=o.agree_margin,
            persist=self.writer.overrides,
            on_expire=metrics.override_expired if metrics is not None else None)
        self.overrides.load(store.overrides_all())
        self._set_entries()

    # --- predictions ---------------------------------------------------------------------
    def decide(self, context: str, history: Sequence[str] | None) -> dict[str, Any] | None:
        """The reply of a rule or an override, or None (ask the model)."""
        match = self.rules.match(context)
        if match is not None:
            if self.metrics is not None:
                self.metrics.rule_hits.labels(action=match.action).inc()
            return {"p_allow": match.p_allow, "band": match.band,
                    "version": self.serving.current.version, "source": "rule",
                    "rule": match.rule}
        if not len(self.overrides):
            return None
        fp = context_fingerprint(context, history)
        ov = self.overrides.lookup(fp)
        if ov is None:
            return None
        if self.metrics is not None:
            self.metrics.override_hits.inc()
        version = self.serving.current.version
        if ov.checked_version < version:
            self._ask_model(fp, ov, context, history, version)
        return {"p_allow": float(ov.label), "band": "allow" if ov.label else "block",
                "version": version, "source": "override", "override": ov.feedback}

    def _ask_model(self, fp: bytes, ov: Override, context: str,
                   history: Sequence[str] | None, version: int) -> None:
        """Ask the serving model about an override's call, off the reply's path (once
        per serving version): when it agrees by the margin, the override expires."""
        ov.checked_version = version
        p = self.serving.cache.peek(PredictionCache.key(version, context, history))
        if p is not None:
            self.overrides.observe_model(fp, ov, p, version)
            return

        def done(fut: Future) -> None:
            if fut.exception() is None:
                r = fut.result()
                self.overrides.observe_model(fp, ov, r["p_allow"], r["version"])
        self.batcher.submit(context, history).add_done_callback(done)

    def stamp(self, reply: dict[str, Any], op: str, context: str,
              seconds: float) -> dict[str, Any]:
        """Give ``reply`` its ``prediction_id`` and queue its audit record (never blocks,
        never raises for a full disk)."""
        pid = self.ids.next()
        reply["prediction_id"] = format_id(pid)
        rec = {"ts": time.time(), "op": op, "version": int(reply["version"]),
               "p_allow": float(reply["p_allow"]), "band": reply["band"],
               "source": reply.get("source", "model"),
               "latency_ms": round(seconds * 1000.0, 3),
               "tool": tool_of(context)[:TOOL_BYTES]}
        for extra in ("rule", "override"):
            if extra in reply:
                rec[extra] = reply[extra]
        self.writer.audit(pid, rec)
        return reply

    # --- signals -------------------------------------------------------------------------
    def on_signals(self, signals: Sequence[dict[str, Any]],
                   acks: Sequence[tuple[int, bool]]) -> Future | None:
        """Signals just committed (validated, with their (seq, duplicate)): corrections
        enter the override memory now (the Future is their LMDB commit), referenced
        predictions get their outcome. Duplicates were handled when first stored."""
        now = time.time()
        corrections: list[tuple[bytes, Override]] = []
        for sig, (seq, dup) in zip(signals, acks, strict=True):
            if dup:
                continue
            feedback, pid = sig.get("feedback"), sig.get("prediction_id")
            if feedback not in CORRECTIONS and pid is None:
                continue
            label = label_and_weight(sig, 0)[0]
            if pid is not None:
                self.writer.link(pid, label, seq)
            if feedback in CORRECTIONS:
                corrections.append((context_fingerprint(sig["context"], sig["history"]),
                                    Override(int(label), feedback, now, seq,
                                             tool_of(sig["context"])[:TOOL_BYTES])))
        fut = self.overrides.remember(corrections)
        self._set_entries()
        return fut

    # --- the daemon's housekeeping ---------------------------------------------------------
    def apply_config(self, cfg: Any) -> None:
        """Hot reload: [rules], [overrides], audit retention."""
        self.rules = RuleSet.from_config(cfg.rules)
        o = cfg.overrides
        self.overrides.configure(max_entries=o.max_entries, ttl_s=o.ttl_s,
                                 agree_margin=o.agree_margin)
        self.writer.retention(cfg.audit.max_entries, cfg.audit.max_age_s)
        self._set_entries()

    def tick(self) -> None:
        """From the daemon's main loop: TTL sweep, gauges."""
        self.overrides.sweep()
        self._set_entries()

    def _set_entries(self) -> None:
        if self.metrics is not None:
            self.metrics.override_entries.set(len(self.overrides))

    def status(self) -> dict[str, Any]:
        w = self.writer
        return {"rules": len(self.rules),
                "overrides": {"entries": len(self.overrides), "hits": self.overrides.hits},
                "audit": {"written": w.written, "dropped": w.dropped, "pending": w.pending},
                "served_alignment": {"alignment": w.alignment.value,
                                     "window": len(w.alignment.window),
                                     "linked": w.alignment.linked,
                                     "unlinked": w.alignment.unlinked}}

    def close(self, timeout: float = 5.0) -> None:
        self.writer.close(timeout)
