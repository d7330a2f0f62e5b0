"""Group commit: many callers, one writer thread, one transaction (one fsync) per round.

A durable commit costs an fsync, so committing each client's signal alone caps ingest at
the disk's fsync rate. `GroupCommitter.submit` queues the signals and returns a
`concurrent.futures.Future`; the writer thread takes everything queued (up to
``max_batch`` signals; if the last round had more callers, it waits up to
``gather_seconds`` for them), appends it in ONE transaction, and only after the commit returned
resolves each caller's future with its ``(seq, duplicate)`` results. A failed commit
(disk full, ...) fails every future of that round with the error: nothing of it was
acknowledged, and a client may re-send (ids make that idempotent).

The committer takes signals as `gated.signals.validate_signal` returned them: the daemon
validates each signal once, at ingest, against the configured limits, and this layer
does not validate again. It only checks, cheaply and before queueing, what a bad
signal would otherwise turn into a failed commit for every caller of its round: the
normalised shape, and an ``id`` short enough to be an LMDB key.

From asyncio: ``results = await committer.submit_async(signals)``: the round's replies
to one event loop are handed over in ONE ``call_soon_threadsafe``, where a
`concurrent.futures.Future` wrapped by `asyncio.wrap_future` costs one per caller (a wake-up
of the loop each, while the writer still resolves the others): 1.22x the signals/s of 8
waiting single-signal clients, the code before and after alternated on one machine
(README, the ingest rows).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from ..config.limits import MAX_ID_BYTES_CEILING
from ..signals import SIGNAL_KEY_SET, SIGNAL_KEYS, WeightTable

log = logging.getLogger("gated.store")

Results = list[tuple[int, bool]]
_STOP = object()

#: How long a commit round may wait for the callers the last round had (`_gather`): a few
#: client round trips on one machine, a fraction of the two fsyncs a commit costs.
GATHER_SECONDS = 200e-6


class _LoopWaiter:
    """A `submit_async` caller: its event loop and the asyncio future it awaits."""

    __slots__ = ("loop", "future")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> None:
        self.loop, self.future = loop, future


def _settle(replies: list[tuple[asyncio.Future, Results | None, BaseException | None]]
            ) -> None:
    """On the waiters' event loop: resolve every future of one round (one that its caller
    cancelled meanwhile is left alone)."""
    for future, results, error in replies:
        if future.done():
            continue
        if error is None:
            future.set_result(results)
        else:
            future.set_exception(error)


#: a normalised signal the daemon added the logit it served to (`ServedDeep.attach`)
_WITH_SERVED_LOGIT = SIGNAL_KEY_SET | {"served"}


def check_normalised(signals: Sequence[Mapping[str, Any]]) -> None:
    """Raise if a signal is not as `validate_signal` returns it, or its id cannot be a key.

    Not a validation (sizes, types and values were checked at ingest): a guard of what
    the writer and LMDB rely on, O(1) per signal. ``TypeError``/``ValueError`` here mean
    a caller skipped `validate_signal`, which is a bug, not a client error.
    """
    for i, s in enumerate(signals):
        if type(s) is not dict or (s.keys() != SIGNAL_KEY_SET
                                   and s.keys() != _WITH_SERVED_LOGIT):
            got = sorted(map(str, s)) if isinstance(s, Mapping) else type(s).__name__
            raise TypeError(f"signal #{i} was not normalised by validate_signal() (its keys "
                            f"are {', '.join(SIGNAL_KEYS)}); got {got}")
        sid = s["id"]
        if sid is not None and len(sid.encode("utf-8")) > MAX_ID_BYTES_CEILING:
            raise ValueError(f"signal #{i}: its id is longer than {MAX_ID_BYTES_CEILING} "
                             "UTF-8 bytes, the largest LMDB key (limits.max_id_bytes must "
                             "not exceed it)")


class GroupCommitter:
    """Batches `Store.append_signals` across threads. Start it, submit, `close()` it."""

    def __init__(self, store: Any, *, max_batch: int = 8192,
                 on_commit: Callable[[int, int], None] | None = None,
                 weights: WeightTable | None = None,
                 gather_seconds: float = GATHER_SECONDS) -> None:
        """``on_commit(last_seq, n_signals)`` runs on the writer thread after each commit
        (e.g. to wake the trainer); ``weights`` replaces the store's label/weight table
        (see `set_weights`); ``gather_seconds``: how long a round may wait for the callers
        the last round had (`_gather`; 0 commits whatever is queued at once)."""
        self.store = store
        self.gather_seconds = max(0.0, gather_seconds)
        if weights is not None:
            store.set_weights(weights)
        self.max_batch = max(1, max_batch)
        self.on_commit = on_commit
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pending = 0
        self._lock = threading.Lock()
        self._closed = False
        self.commits = 0
        self.committed_signals = 0
        self.failed_commits = 0
        self.last_commit_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="gated-group-commit",
                                        daemon=True)
        self._thread.start()

    def submit(self, signals: Sequence[Mapping[str, Any]]) -> Future[Results]:
        """Queue signals already returned by `validate_signal`; the future resolves with
        ``[(seq, duplicate), ...]`` in order, after they committed. A signal that was not
        normalised raises here (see `check_normalised`), before anything is queued."""
        fut: Future[Results] = Future()
        if not self._enqueue(signals, fut):
            fut.set_result([])
        return fut

    def submit_async(self, signals: Sequence[Mapping[str, Any]]) -> asyncio.Future[Results]:
        """`submit` for a caller on a running event loop: an asyncio future, resolved on
        that loop with the rest of its round's replies in one hand-over (module doc).
        Signals queued here are committed even if the caller stops waiting (a client that
        disconnected and re-sends is deduplicated by its ids); `submit`'s cancelled
        futures are not."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Results] = loop.create_future()
        if not self._enqueue(signals, _LoopWaiter(loop, future)):
            future.set_result([])
        return future

    def _enqueue(self, signals: Sequence[Mapping[str, Any]], waiter: Any) -> bool:
        """Check and queue `signals` for `waiter` (either kind); False when there are
        none, so nothing was queued and the caller answers at once."""
        check_normalised(signals)
        checked = list(signals)
        if not checked:
            return False
        with self._lock:
            if self._closed:
                raise RuntimeError("the group committer is closed; the daemon is shutting down")
            self._pending += len(checked)
            self._q.put((checked, waiter))
        return True

    def set_weights(self, table: WeightTable) -> None:
        """Hot reload of the label/weight table: applies from the next commit on (a batch
        is always labelled with one table); stored signals keep the weight they got."""
        self.store.set_weights(table)

    def append(self, signals: Sequence[Mapping[str, Any]],
               timeout: float | None = None) -> Results:
        """Blocking convenience: submit and wait for the commit."""
        return self.submit(signals).result(timeout)

    @property
    def pending(self) -> int:
        """Signals queued and not yet committed (the ingest queue depth)."""
        return self._pending

    def close(self, timeout: float | None = None) -> None:
        """Commit everything already submitted, then stop the writer thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._q.put(_STOP)
        self._thread.join(timeout)

    def __enter__(self) -> GroupCommitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the writer thread ----------------------------------------------------------------------
    def _run(self) -> None:
        stopping, expected = False, 1
        while not stopping:
            item = self._q.get()
            if item is _STOP:
                break
            batch, stopping = self._gather(item, expected)
            expected = len(batch)
            self._commit(batch)

    def _gather(self, first: Any, expected: int) -> tuple[list, bool]:
        """The round that `first` opens: everything queued (up to ``max_batch`` signals),
        and while it has fewer callers than the last round had (`expected`), whatever
        arrives within ``gather_seconds``. Returns (the round, whether a stop came).

        Why wait at all: callers that wait for their reply send again as soon as the
        last commit answered them, a few tens of microseconds apart; committing the
        first at once splits them into two rounds, each paying two fsyncs for half of
        them (measured, 8 waiting single-signal clients on the 2-core VM: 4.9 signals per
        commit, 8.0 with the wait, 1.12x the signals/s side by side; docs/benchmarks.md
        "Durable ingest"; the slower the disk's fsync, the more a round costs). A lone
        caller never waits (the last round had one), and a round whose callers did not
        all come back costs one wait, after which the expectation is what came. The same
        idea as PostgreSQL's commit_delay / commit_siblings."""
        batch, n = [first], len(first[0])
        deadline = time.perf_counter() + self.gather_seconds
        while n < self.max_batch:
            try:
                more = self._q.get_nowait()
            except queue.Empty:
                left = deadline - time.perf_counter()
                if len(batch) >= expected or left <= 0:
                    break
                try:
                    more = self._q.get(timeout=left)
                except queue.Empty:
                    break
            if more is _STOP:
                return batch, True
            batch.append(more)
            n += len(more[0])
        return batch, False

    def _commit(self, batch: list[tuple[list[dict], Future[Results] | _LoopWaiter]]) -> None:
        live = [(sigs, w) for sigs, w in batch
                if type(w) is _LoopWaiter or w.set_running_or_notify_cancel()]
        signals = [s for sigs, _ in live for s in sigs]
        t0 = time.perf_counter()
        try:
            results = self.store.append_signals(signals, validated=True) if signals else []
        except BaseException as e:  # every caller of this round learns why
            self.failed_commits += 1
            log.error("group commit of %d signal(s) from %d caller(s) failed: %s", len(signals),
                      len(live), e)
            self._reply(live, None, e)
            return
        finally:
            with self._lock:
                self._pending -= sum(len(sigs) for sigs, _ in batch)
        self.last_commit_seconds = time.perf_counter() - t0
        self.commits += 1
        self.committed_signals += len(signals)
        if self.on_commit is not None and results:
            try:
                self.on_commit(max(seq for seq, _ in results), len(signals))
            except Exception:
                log.exception("on_commit callback failed (the signals are committed)")
        self._reply(live, results, None)

    @staticmethod
    def _reply(live: list, results: Results | None, error: BaseException | None) -> None:
        """Each caller's share of the round's results (or its error): `submit`'s futures
        here, `submit_async`'s in one ``call_soon_threadsafe`` per event loop."""
        loops: dict[asyncio.AbstractEventLoop, list] = {}
        i = 0
        for sigs, waiter in live:
            mine = None if results is None else results[i:i + len(sigs)]
            i += len(sigs)
            if type(waiter) is _LoopWaiter:
                loops.setdefault(waiter.loop, []).append((waiter.future, mine, error))
            elif error is None:
                waiter.set_result(mine)
            else:
                waiter.set_exception(error)
        for loop, replies in loops.items():
            try:
                loop.call_soon_threadsafe(_settle, replies)
            except RuntimeError:  # that loop is closed: nobody is left to answer
                log.debug("group commit: %d reply(s) to a closed event loop dropped "
                          "(the round's commit or failure stands)", len(replies))
