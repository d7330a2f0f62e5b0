"""Group commit against a real LMDB store: many callers (threads, asyncio) batched into one
transaction, acknowledged only after it commits, deduplicated by id, weights hot-reloaded."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from store_examples import vsig

from gated.signals import WeightTable, validate_signal
from gated.store import GroupCommitter, Store, StoreError


# --- group commit -------------------------------------------------------------------------------
def test_group_commit_batches_many_callers_and_acks_after_commit(store):
    seen_committed = []

    def on_commit(last_seq: int, n: int) -> None:
        seen_committed.append(last_seq)

    with GroupCommitter(store, on_commit=on_commit) as gc:
        futures = [gc.submit([vsig(i)]) for i in range(200)]

        def check(fut):  # when a future resolves, a NEW read transaction sees its signal
            seq = fut.result()[0][0]
            assert store.read_signals(seq - 1, 1)[0][0] == seq

        for f in futures:
            f.add_done_callback(check)
        results = [f.result(timeout=10)[0] for f in futures]
    assert sorted(seq for seq, _ in results) == list(range(1, 201))
    assert gc.commits < 200 / 4, "callers must share commits"
    assert gc.committed_signals == 200 and gc.pending == 0
    assert seen_committed[-1] == 200


def test_group_commit_from_threads_dedups_the_same_id(store):
    gc = GroupCommitter(store)
    out: list[tuple[int, bool]] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        for i in range(10):
            res = gc.append([vsig(f"shared-{i}")]) + gc.append([vsig(f"own-{k}-{i}")])
            with lock:
                out.extend(res)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.close()
    assert store.count_signals() == 10 + 8 * 10
    assert sum(not dup for _, dup in out) == 10 + 8 * 10
    seqs = [seq for seq, _ in store.read_signals(0, 10_000)]
    assert seqs == list(range(1, 91))
    assert gc.commits < 2 * 90, "8 threads must share commits"


def test_group_commit_weights_hot_reload(store):
    fp = validate_signal({"context": "same call", "decision": "block",
                          "feedback": "false_positive"})
    with GroupCommitter(store, weights=WeightTable(escalation=(3.0,))) as gc:
        gc.append([fp, validate_signal({"context": "a", "decision": "allow",
                                        "feedback": "confirm"})])
        gc.set_weights(WeightTable(confirm=0.5, escalation=(4.0, 6.0, 9.0)))
        gc.append([fp, validate_signal({"context": "b", "decision": "allow",
                                        "feedback": "confirm"})])
    got = [(r["weight"]) for _, r in store.read_signals(0, 10)]
    # the second fp is the second for this context: escalation[1] of the new table
    assert got == [3.0, 1.0, 6.0, 0.5]
    with pytest.raises(TypeError):
        store.set_weights({"confirm": 1.0})


def test_group_commit_trusts_validated_signals_and_guards_only_the_shape(store):
    """No second validation: a normalised signal is stored as it is. Only what would
    fail the whole round is refused, synchronously and for that caller alone: a signal
    that skipped validate_signal, or an id longer than an LMDB key."""
    with GroupCommitter(store) as gc:
        unvalidated = {"context": "x", "decision": "allow"}
        with pytest.raises(TypeError, match=r"signal #1 was not normalised"):
            gc.submit([vsig(1), unvalidated])
        with pytest.raises(ValueError, match="longer than 511 UTF-8 bytes"):
            gc.submit([{**vsig(2), "id": "i" * 512}])
        assert gc.pending == 0
        assert gc.append([{**vsig(3), "id": "i" * 511}]) == [(1, False)]
    assert store.read_signals(0, 10)[0][1]["id"] == "i" * 511
    with pytest.raises(RuntimeError):
        gc.submit([vsig(4)])


class _HeldStore:
    """The real store, with its next append held until `release` (the writer thread
    then sits inside a commit, as it does while a real one fsyncs)."""

    def __init__(self, store: Store) -> None:
        self.store, self.entered, self._go = store, threading.Event(), threading.Event()
        self.rounds: list[int] = []

    def append_signals(self, signals, **kw):
        self.rounds.append(len(signals))
        if not self._go.is_set():
            self.entered.set()
            self._go.wait(10)
        return self.store.append_signals(signals, **kw)

    def release(self) -> None:
        self._go.set()


def test_group_commit_waits_for_the_callers_the_last_round_had(store):
    """Callers that each wait for their reply come back a few microseconds apart; a
    round waits (up to gather_seconds) for as many as the last round had, instead of
    committing the first alone and the rest in a second round of fsyncs. A round that
    waited in vain sets the expectation to what came, and a lone caller never waits."""
    held = _HeldStore(store)
    with GroupCommitter(held, gather_seconds=0.5) as gc:
        first = gc.submit([vsig(0)])
        assert held.entered.wait(10)  # round 1 (one caller) is inside its commit
        queued = [gc.submit([vsig(i)]) for i in range(1, 5)]
        held.release()
        assert [f.result(10)[0][1] for f in [first, *queued]] == [False] * 5
        assert held.rounds == [1, 4]  # round 2: the four queued callers

        early = gc.submit([vsig(5)])  # round 3 expects four callers: it waits for them
        time.sleep(0.05)
        late = [gc.submit([vsig(i)]) for i in range(6, 9)]
        for f in [early, *late]:
            f.result(10)
        assert held.rounds == [1, 4, 4]

        t = time.perf_counter()
        gc.append([vsig(9)], timeout=10)  # expected four, one came: waits once ...
        assert time.perf_counter() - t >= 0.45
        t = time.perf_counter()
        gc.append([vsig(10)], timeout=10)  # ... then expects one and commits at once
        assert time.perf_counter() - t < 0.25
        assert held.rounds == [1, 4, 4, 1, 1]
    assert [seq for seq, _ in store.read_signals(0, 100)] == list(range(1, 12))


def test_group_commit_from_asyncio(store):
    async def main() -> list:
        with GroupCommitter(store) as gc:
            return await asyncio.gather(*(asyncio.wrap_future(gc.submit([vsig(i)]))
                                          for i in range(20)))

    results = asyncio.run(main())
    assert sorted(r[0][0] for r in results) == list(range(1, 21))


def test_submit_async_answers_a_round_in_one_hand_over_to_the_loop(store, monkeypatch):
    """`submit_async` callers on one event loop get their round's replies through one
    ``call_soon_threadsafe`` (one `_settle`), beside `submit`'s thread callers in the same
    round; a caller that stopped waiting still has its signals committed; a failed commit
    reaches every async caller as its error; a closed committer refuses."""
    from gated.store import group

    settled: list[int] = []
    real_settle = group._settle

    def counting_settle(replies):
        settled.append(len(replies))
        real_settle(replies)

    monkeypatch.setattr(group, "_settle", counting_settle)
    held = _HeldStore(store)

    async def main() -> tuple[list, list]:
        with GroupCommitter(held) as gc:
            first = gc.submit_async([vsig(0)])
            while not held.entered.is_set():  # round 1 (one caller) sits in its commit
                await asyncio.sleep(0.001)
            waiting = [gc.submit_async([vsig(i)]) for i in range(1, 6)]
            gone = gc.submit_async([vsig(6), vsig(7)])
            gone.cancel()  # its caller stopped waiting: the round commits it anyway
            threads = [gc.submit([vsig(i)]) for i in (8, 9)]
            held.release()
            got = await asyncio.gather(first, *waiting)
            return got, [f.result(10) for f in threads]

    got, from_threads = asyncio.run(main())
    assert held.rounds == [1, 9]  # round 2: five async callers, the gone one, two threads
    assert settled == [1, 6]  # one hand-over per round to this loop (with the gone one)
    assert [r[0][0] for r in got] == list(range(1, 7))
    assert [r[0][0] for r in from_threads] == [9, 10]
    assert [seq for seq, _ in store.read_signals(0, 100)] == list(range(1, 11))

    class FailingStore:
        def append_signals(self, signals, **kw):
            raise StoreError("disk on fire")

    async def failing() -> list:
        gc = GroupCommitter(FailingStore())
        try:
            return await asyncio.gather(*(gc.submit_async([vsig(i)]) for i in range(4)),
                                        return_exceptions=True)
        finally:
            gc.close()
            with pytest.raises(RuntimeError, match="closed"):
                gc.submit_async([vsig(99)])

    errors = asyncio.run(failing())
    assert [type(e) for e in errors] == [StoreError] * 4
