"""The durable store against real LMDB environments in temporary directories."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time

import numpy as np
import pytest

from gated.signals import SignalError, WeightTable, validate_signal
from gated.store import (
    CheckpointMismatch,
    GroupCommitter,
    Store,
    StoreError,
    StoreFullError,
    backup,
    format_inspect,
    inspect,
    load_published,
)
from gated.store.env import close_readers

KiB = 1024


def sig(i: int | str, **kw) -> dict:
    base = {"context": f"fs.read(path='/srv/{i}')", "decision": "allow", "id": f"id-{i}"}
    base.update(kw)
    return base


def vsig(i: int | str, **kw) -> dict:
    """A signal as the daemon hands it to the group committer: validated once, at ingest."""
    return validate_signal(sig(i, **kw))


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state")
    yield s
    s.close()
    close_readers()


# --- signal log ---------------------------------------------------------------------------------
def test_append_assigns_contiguous_seqs_and_reads_back(store):
    res = store.append_signals([sig(i, reason=f"r{i}", history=["h"]) for i in range(5)])
    assert res == [(i, False) for i in range(1, 6)]
    got = store.read_signals(0, 100)
    assert [seq for seq, _ in got] == [1, 2, 3, 4, 5]
    first = got[0][1]
    assert first["context"] == "fs.read(path='/srv/0')" and first["reason"] == "r0"
    assert first["history"] == ["h"] and first["label"] == 1.0 and first["weight"] == 1.0
    assert store.read_signals(3, 1)[0][0] == 4
    assert store.read_signals(5, 10) == []
    assert store.last_seq() == 5 and store.count_signals() == 5 and store.first_seq() == 1


def test_invalid_signal_rejects_the_whole_batch(store):
    with pytest.raises(SignalError) as info:
        store.append_signals([sig(1), {"context": "x"}])
    assert info.value.index == 1 and info.value.code == "missing_field"
    assert store.count_signals() == 0 and store.last_seq() == 0


def test_dedup_by_id_within_batch_across_batches_and_restarts(tmp_path):
    path = tmp_path / "state"
    with Store(path) as s:
        assert s.append_signals([sig("a"), sig("b"), sig("a")]) == [(1, False), (2, False),
                                                                    (1, True)]
        assert s.append_signals([sig("c"), sig("b", decision="block")]) == [(3, False),
                                                                           (2, True)]
        # signals without an id are never deduplicated
        assert s.append_signals([sig(9, id=None), sig(9, id=None)]) == [(4, False), (5, False)]
    with Store(path) as s:
        assert s.append_signals([sig("a")]) == [(1, True)]
        assert s.count_signals() == 5
        # the duplicate did not overwrite the original content
        assert s.read_signals(1, 1)[0][1]["decision"] == "allow"
        assert s.lookup_id("id-b") == 2 and s.lookup_id("zz") is None


def test_escalation_persists_across_restarts(tmp_path):
    path = tmp_path / "state"
    ctx = "http.post(url='https://intranet/wiki', body='hello')"
    weights = []
    for variant in (ctx, "  " + ctx.replace(", ", ",   "), ctx + "\n", ctx):
        with Store(path) as s:
            seq, _ = s.append_signals([{"context": variant, "decision": "block",
                                        "feedback": "false_positive"}])[0]
            weights.append(s.read_signals(seq - 1, 1)[0][1]["weight"])
    assert weights == [4.0, 6.0, 8.0, 8.0]
    with Store(path) as s:
        assert s.escalation(ctx, "false_positive") == 4
        assert s.escalation(ctx, "false_negative") == 0
        # a false negative on the same context has its own counter
        (seq, _), = s.append_signals([{"context": ctx, "decision": "allow",
                                       "feedback": "false_negative"}])
        rec = s.read_signals(seq - 1, 1)[0][1]
        assert (rec["label"], rec["weight"]) == (0.0, 4.0)


def test_duplicate_does_not_escalate(store):
    fp = {"context": "rm tmp", "decision": "block", "feedback": "false_positive", "id": "x"}
    store.append_signals([fp, fp])
    store.append_signals([fp])
    assert store.escalation("rm tmp") == 1


def test_escalation_within_one_batch_and_configured_weights(tmp_path):
    table = WeightTable(escalation=(3.0, 5.0))
    with Store(tmp_path / "s", weights=table) as s:
        fp = {"context": "same", "decision": "block", "feedback": "false_positive"}
        s.append_signals([fp, fp, fp])
        assert [r["weight"] for _, r in s.read_signals(0, 10)] == [3.0, 5.0, 5.0]


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


# --- replay reservoir ---------------------------------------------------------------------------
def ex(i: int, feedback: str | None = None) -> dict:
    return {"context": f"call {i}", "history": [], "reason": None, "label": 1.0,
            "weight": 1.0, "feedback": feedback, "i": i}


def test_reservoir_keeps_locked_examples_forever(tmp_path):
    path = tmp_path / "state"
    rng = random.Random(0)
    with Store(path, replay_slots=20) as s:
        s.reservoir_add([ex(i, "false_positive" if i < 3 else None) for i in range(10)], rng)
        s.reservoir_add([ex(100 + i, "false_negative") for i in range(2)], rng)
        for chunk in range(8):
            s.reservoir_add([ex(1000 + chunk * 250 + i) for i in range(250)], rng)
    with Store(path, replay_slots=20) as s:
        stats = s.reservoir_stats()
        assert stats["size"] == 20 and stats["locked"] == 5
        everything = s.reservoir_sample(100, random.Random(1))
        assert len(everything) == 20
        locked = sorted(e["context"] for e in everything if e["locked"])
        assert locked == ["call 0", "call 1", "call 100", "call 101", "call 2"]
        assert {e["feedback"] for e in everything if e["locked"]} == {"false_positive",
                                                                      "false_negative"}


def test_reservoir_is_uniform_over_history_not_recent(tmp_path):
    with Store(tmp_path / "s", replay_slots=200) as s:
        rng = random.Random(42)
        for chunk in range(5):
            s.reservoir_add([ex(chunk * 2000 + i) for i in range(2000)], rng)
        kept = [int(e["context"].split()[1]) for e in s.reservoir_sample(200, rng)]
    assert len(kept) == 200
    # 10,000 offered: a uniform sample has mean ~5000 (sd ~200); recency bias would not
    assert 4000 < np.mean(kept) < 6000
    assert min(kept) < 2000


def test_reservoir_when_every_slot_is_locked(tmp_path):
    with Store(tmp_path / "s", replay_slots=4) as s:
        rng = random.Random(0)
        s.reservoir_add([ex(i) for i in range(4)], rng)
        s.reservoir_add([ex(10 + i, "false_positive") for i in range(6)], rng)
        stats = s.reservoir_stats()
        # locked ones evicted every unlocked example, then grew past capacity
        assert stats == {"size": 6, "locked": 6, "unlocked": 0, "seen_unlocked": 4,
                         "capacity": 4}
        assert s.reservoir_add([ex(99)], rng) == 0  # ordinary examples are not kept now
        assert s.reservoir_size() == 6


def test_reservoir_skips_examples_offered_before_a_restart(store):
    first = [{**ex(i), "seq": i} for i in range(1, 11)]
    assert store.reservoir_add(first, random.Random(0)) == 10
    # after a crash the trainer re-trains seqs 6..12: only 11 and 12 are new to the reservoir
    again = [{**ex(i), "seq": i} for i in range(6, 13)]
    assert store.reservoir_add(again, random.Random(0)) == 2
    assert store.reservoir_stats()["seen_unlocked"] == 12


def test_reservoir_sampling_is_seeded(store):
    store.reservoir_add([ex(i) for i in range(100)], random.Random(3))
    a = store.reservoir_sample(10, random.Random(7))
    b = store.reservoir_sample(10, random.Random(7))
    c = store.reservoir_sample(10, np.random.default_rng(7))
    assert a == b and len(c) == 10
    assert len({e["context"] for e in a}) == 10  # distinct
    assert store.reservoir_sample(5, random.Random(0))[0].keys() >= {
        "context", "history", "reason", "label", "weight"}


# --- checkpoint ---------------------------------------------------------------------------------
LAYOUT = [("tok_emb", (10, 4)), ("gate.w", (1, 4)), ("gate.b", (1,))]
N = 45


def test_checkpoint_round_trip(store):
    rng = np.random.default_rng(0)
    flat, m, v = (rng.standard_normal(N).astype(np.float32) for _ in range(3))
    ewc = {"fisher": rng.random(N).astype(np.float32), "consolidated": np.array([1.0],
                                                                              np.float32)}
    assert store.load_checkpoint(layout=LAYOUT, config_fingerprint="fp") is None
    store.save_checkpoint(flat=flat, m=m, v=v, step=7, last_trained_seq=42, layout=LAYOUT,
                          config_fingerprint="fp", ewc=ewc, extra={"opt_t": 7, "version": 2})
    c = store.load_checkpoint(layout=LAYOUT, config_fingerprint="fp")
    assert c is not None and c.step == 7 and c.last_trained_seq == 42
    np.testing.assert_array_equal(c.flat, flat)
    np.testing.assert_array_equal(c.m, m)
    np.testing.assert_array_equal(c.v, v)
    np.testing.assert_array_equal(c.ewc["fisher"], ewc["fisher"])
    assert c.flat.dtype == np.float32 and c.flat.flags.writeable
    assert c.extra == {"opt_t": 7, "version": 2} and c.layout == LAYOUT
    # a later checkpoint without EWC drops the old EWC arrays
    store.save_checkpoint(flat=flat, m=m, v=v, step=8, last_trained_seq=43, layout=LAYOUT,
                          config_fingerprint="fp", ewc=None, extra=None)
    c = store.load_checkpoint(layout=LAYOUT, config_fingerprint="fp")
    assert c.ewc is None and c.step == 8


def test_checkpoint_keeps_float64(store):
    flat = np.linspace(0, 1, N)
    store.save_checkpoint(flat=flat, m=flat, v=flat, step=1, last_trained_seq=0, layout=LAYOUT,
                          config_fingerprint="fp")
    c = store.load_checkpoint(layout=LAYOUT, config_fingerprint="fp")
    assert c.flat.dtype == np.float64 and np.array_equal(c.flat, flat)


def test_checkpoint_layout_or_config_mismatch_names_both_sides(store):
    z = np.zeros(N, np.float32)
    store.save_checkpoint(flat=z, m=z, v=z, step=3, last_trained_seq=0, layout=LAYOUT,
                          config_fingerprint="tiny-abc")
    other = [("tok_emb", (10, 4)), ("gate.w", (1, 5))]
    with pytest.raises(CheckpointMismatch) as info:
        store.load_checkpoint(layout=other, config_fingerprint="flint-def")
    msg = str(info.value)
    assert "tiny-abc" in msg and "flint-def" in msg
    assert "gate.w [1, 4]" in msg and "gate.w [1, 5]" in msg
    assert "--reinit" in msg and "--state-dir" in msg
    with pytest.raises(CheckpointMismatch, match="config fingerprint"):
        store.load_checkpoint(layout=LAYOUT, config_fingerprint="tiny-xyz")


def test_checkpoint_rejects_inconsistent_arrays(store):
    z = np.zeros(N, np.float32)
    with pytest.raises(ValueError):
        store.save_checkpoint(flat=z, m=z[:-1], v=z, step=1, last_trained_seq=0,
                              layout=LAYOUT, config_fingerprint="fp")
    with pytest.raises(ValueError):
        store.save_checkpoint(flat=z, m=z, v=z, step=1, last_trained_seq=0,
                              layout=LAYOUT[:1], config_fingerprint="fp")
    assert store.checkpoint_info() is None


def _ckpt_keys(store) -> list[bytes]:
    def fn(txn):
        return list(txn.cursor(db=store._h.db("ckpt")).iternext(keys=True, values=False))
    return store._h.read(fn)


def test_checkpoint_in_pieces_round_trips_and_keeps_one_generation(store, monkeypatch):
    """Arrays larger than a piece are split over several write transactions (LMDB's one
    writer is held a piece at a time) and joined back exactly; a save replaces the older
    generation's pieces."""
    from gated.store import checkpoint

    monkeypatch.setattr(checkpoint, "PIECE_BYTES", 64)  # 45 float32 = 180 bytes: 3 pieces
    rng = np.random.default_rng(1)
    for step in (1, 2):
        flat, m, v = (rng.standard_normal(N).astype(np.float32) for _ in range(3))
        fisher = rng.random(N)  # float64: 360 bytes, 6 pieces
        store.save_checkpoint(flat=flat, m=m, v=v, step=step, last_trained_seq=step,
                              layout=LAYOUT, config_fingerprint="fp", ewc={"fisher": fisher})
        c = store.load_checkpoint(layout=LAYOUT, config_fingerprint="fp")
        assert c.step == step
        for got, want in ((c.flat, flat), (c.m, m), (c.v, v), (c.ewc["fisher"], fisher)):
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
        keys = _ckpt_keys(store)
        assert len(keys) == 1 + 3 * 3 + 6  # the head and ONE generation's pieces
        assert len({k.split(b"/")[0] for k in keys if k != b"head"}) == 1


def test_a_save_that_dies_before_its_head_leaves_the_last_checkpoint(store, monkeypatch):
    """Pieces written, head not switched (a kill -9, a full disk at the last
    transaction): the last checkpoint loads whole, and the next save deletes the pieces."""
    from gated.store import checkpoint

    monkeypatch.setattr(checkpoint, "PIECE_BYTES", 64)
    one, two = np.full(N, 1.0, np.float32), np.full(N, 2.0, np.float32)
    store.save_checkpoint(flat=one, m=one, v=one, step=1, last_trained_seq=10, layout=LAYOUT,
                          config_fingerprint="fp")
    kept = len(_ckpt_keys(store))

    def dies(fn, *, what):
        raise StoreFullError(f"{what}: the disk is full")
    with monkeypatch.context() as mp:
        mp.setattr(store, "_write_with_metrics", dies)
        with pytest.raises(StoreFullError):
            store.save_checkpoint(flat=two, m=two, v=two, step=2, last_trained_seq=20,
                                  layout=LAYOUT, config_fingerprint="fp")
    assert len(_ckpt_keys(store)) == 2 * kept - 1  # the dead save's pieces are there
    c = store.load_checkpoint(layout=LAYOUT, config_fingerprint="fp")
    assert c.step == 1 and c.last_trained_seq == 10 and np.all(c.flat == 1) and np.all(c.v == 1)
    assert store.checkpoint_info()["step"] == 1
    store.save_checkpoint(flat=two, m=two, v=two, step=3, last_trained_seq=30, layout=LAYOUT,
                          config_fingerprint="fp")
    assert len(_ckpt_keys(store)) == kept
    c = store.load_checkpoint(layout=LAYOUT, config_fingerprint="fp")
    assert c.step == 3 and np.all(c.m == 2)


def test_a_checkpoint_written_before_pieces_loads_and_the_next_save_replaces_it(store):
    """A state directory from before pieces: the head names no generation and the arrays
    are single keys. It loads; the next save switches to pieces and deletes those keys."""
    from gated.store.codec import pack

    old = np.arange(N, dtype=np.float32)
    head = {"format": 2, "step": 5, "last_trained_seq": 50,
            "layout": [[n, list(s)] for n, s in LAYOUT], "config_fingerprint": "fp",
            "dtype": old.dtype.str, "n": N, "ewc": {}, "extra": None, "saved_at": 0.0}

    def legacy(txn):
        db = store._db("ckpt")
        for name, arr in (("flat", old), ("m", old * 2), ("v", old * 3)):
            txn.put(name.encode(), arr.view(np.uint8), db=db)
        txn.put(b"head", pack(head), db=db)
    store._h.write(legacy, what="a checkpoint as written before pieces")
    c = store.load_checkpoint(layout=LAYOUT, config_fingerprint="fp")
    assert c.step == 5 and np.array_equal(c.flat, old) and np.array_equal(c.v, old * 3)
    store.save_checkpoint(flat=old + 1, m=old, v=old, step=6, last_trained_seq=60,
                          layout=LAYOUT, config_fingerprint="fp")
    assert not {b"flat", b"m", b"v"} & set(_ckpt_keys(store))
    c = store.load_checkpoint(layout=LAYOUT, config_fingerprint="fp")
    assert c.step == 6 and np.array_equal(c.flat, old + 1)


# --- published snapshots ------------------------------------------------------------------------
def test_publish_keeps_the_last_versions(store):
    for version in range(1, 6):
        store.publish(version, np.full(100, version, np.float32), step=version * 10, keep=3)
    version, flat = store.load_published()
    assert version == 5 and np.all(flat == 5) and flat.flags.writeable
    info = store.published_info()
    assert info["kept"] == [3, 4, 5] and info["step"] == 50
    # the module-level reader in the same process shares the open environment
    v2, flat2 = load_published(store.path)
    assert v2 == 5 and np.array_equal(flat2, flat)


def test_publish_after_reinit_restarts_versions(store):
    for version in (1, 2, 3):
        store.publish(version, np.full(10, version, np.float32), step=version)
    store.publish(1, np.full(10, 11, np.float32), step=0)
    version, flat = store.load_published()
    assert version == 1 and np.all(flat == 11)
    assert store.published_info()["kept"] == [1]


def test_load_published_without_state(tmp_path):
    assert load_published(tmp_path / "nothing") is None
    with Store(tmp_path / "s") as s:
        assert s.load_published() is None


def test_load_published_read_only_from_a_closed_store(tmp_path):
    with Store(tmp_path / "s") as s:
        s.publish(4, np.arange(8, dtype=np.float32), step=1)
    version, flat = load_published(tmp_path / "s")
    assert version == 4 and list(flat) == list(range(8))
    close_readers()


# --- metrics history ----------------------------------------------------------------------------
def test_metrics_history_is_bounded_and_ordered(tmp_path):
    path = tmp_path / "s"
    with Store(path, metrics_cap=50) as s:
        for step in range(1, 121):
            s.append_metrics(step, {"loss": np.float32(1.0 / step), "alignment": 0.5,
                                    "lr": 1e-3})
        recs = s.read_metrics(limit=1000)
        assert [r["step"] for r in recs] == list(range(71, 121))
    with Store(path, metrics_cap=50) as s:
        assert [r["step"] for r in s.read_metrics(limit=3)] == [118, 119, 120]
        assert s.count_metrics() == 50
        assert s.read_metrics(limit=1)[0]["loss"] == pytest.approx(1 / 120)
        # a restart that repeats a step number still appends
        s.append_metrics(100, {"loss": 0.1})
        assert s.read_metrics(limit=1)[0]["step"] == 100 and s.count_metrics() == 50


def test_metrics_write_behind_rides_along_and_flushes(tmp_path):
    with Store(tmp_path / "s", metrics_flush_records=10, metrics_flush_seconds=3600) as s:
        for step in range(25):
            s.append_metrics(step, {"loss": 1.0})
        commits = s.stats["commits"]
        assert commits == 2  # two full batches of 10, not 25 fsyncs
        assert inspect(s.path)["metrics"]["records"] == 20  # what is durable
        assert len(s.read_metrics(100)) == 25  # this process sees the staged ones too
        # the trainer's next write carries the staged records at no extra commit
        s.reservoir_add([ex(1)], random.Random(0))
        assert s.stats["commits"] == commits + 1
        assert inspect(s.path)["metrics"]["records"] == 25
        s.append_metrics(99, {"loss": 0.5})
    with Store(tmp_path / "s") as s:  # close() flushed the last one
        assert s.read_metrics(1)[0]["step"] == 99


# --- retention ----------------------------------------------------------------------------------
def test_retention_never_prunes_untrained_signals(store):
    store.append_signals([sig(i) for i in range(100)])
    # nothing trained yet (no checkpoint): nothing may go
    assert store.prune(max_count=10) == 0 and store.count_signals() == 100
    z = np.zeros(N, np.float32)
    store.save_checkpoint(flat=z, m=z, v=z, step=1, last_trained_seq=60, layout=LAYOUT,
                          config_fingerprint="fp")
    # asking beyond the checkpoint is clamped to it
    assert store.prune(max_count=10, upto_seq=90) == 60
    assert store.count_signals() == 40 and store.first_seq() == 61 and store.last_seq() == 100
    # seqs keep growing after pruning; the pruned id is forgotten, a kept one is not
    assert store.append_signals([sig(5), sig(70)]) == [(101, False), (71, True)]


def test_retention_by_age(store):
    store.append_signals([sig(i) for i in range(30)])
    z = np.zeros(N, np.float32)
    store.save_checkpoint(flat=z, m=z, v=z, step=1, last_trained_seq=20, layout=LAYOUT,
                          config_fingerprint="fp")
    assert store.prune(max_age_s=3600) == 0  # everything is fresh
    import time
    assert store.prune(max_age_s=3600, now=time.time() + 7200, upto_seq=15) == 15
    assert store.first_seq() == 16 and store.count_signals() == 15


def test_retention_in_chunks(tmp_path, monkeypatch):
    import gated.store.log as log_mod

    monkeypatch.setattr(log_mod, "_PRUNE_CHUNK", 7)
    with Store(tmp_path / "s") as s:
        s.append_signals([sig(i) for i in range(50)])
        z = np.zeros(N, np.float32)
        s.save_checkpoint(flat=z, m=z, v=z, step=1, last_trained_seq=50, layout=LAYOUT,
                          config_fingerprint="fp")
        assert s.prune(max_count=5) == 45 and s.first_seq() == 46


# --- map growth ---------------------------------------------------------------------------------
def test_map_grows_from_tiny(tmp_path):
    path = tmp_path / "s"
    with Store(path, map_size=64 * KiB) as s:
        start = s.map_size()
        for b in range(40):
            s.append_signals([sig(b * 100 + i, reason="r" * 200) for i in range(100)])
        big = np.arange(300_000, dtype=np.float32)  # 1.2 MB per array: far beyond the map
        s.save_checkpoint(flat=big, m=big, v=big, step=1, last_trained_seq=4000,
                          layout=[("w", (300_000,))], config_fingerprint="fp")
        assert s.stats["grows"] >= 3 and s.map_size() > 16 * start
    with Store(path, map_size=64 * KiB) as s:
        assert s.count_signals() == 4000 and s.last_seq() == 4000
        c = s.load_checkpoint(layout=[("w", (300_000,))], config_fingerprint="fp")
        assert np.array_equal(c.v, big)


def test_map_grows_under_concurrent_writers_and_readers(tmp_path):
    """Growth needs every transaction of the process closed: the gate must neither
    deadlock nor lose a write while signal, trainer and reader threads race it."""
    acked: list[tuple[int, str]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    with Store(tmp_path / "s", map_size=64 * KiB) as s:
        def writer(k: int) -> None:
            try:
                for b in range(15):
                    ids = [f"w{k}-{b}-{i}" for i in range(20)]
                    res = s.append_signals([sig(x, reason="r" * 300) for x in ids])
                    with lock:
                        acked.extend((seq, f"id-{x}") for (seq, _), x in zip(res, ids,
                                                                              strict=True))
            except BaseException as e:  # surfaced below
                errors.append(e)

        def trainer() -> None:
            try:
                rng = random.Random(0)
                for step in range(1, 9):
                    a = np.full(20_000, step, np.float32)
                    s.save_checkpoint(flat=a, m=a, v=a, step=step, last_trained_seq=0,
                                      layout=[("w", (20_000,))], config_fingerprint="fp")
                    s.publish(step, a, step=step)
                    s.reservoir_add([ex(step * 100 + i) for i in range(30)], rng)
            except BaseException as e:
                errors.append(e)

        def reader() -> None:
            try:
                for _ in range(200):
                    s.read_signals(0, 50)
                    got = s.load_published()
                    assert got is None or np.all(got[1] == got[0])
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
        threads += [threading.Thread(target=trainer), threading.Thread(target=reader)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "deadlock"
        assert not errors, errors
        assert s.stats["grows"] >= 2
        log = dict(s.read_signals(0, 10_000))
        assert sorted(log) == list(range(1, 3 * 15 * 20 + 1))
        assert all(log[seq]["id"] == sid for seq, sid in acked)
        c = s.load_checkpoint(layout=[("w", (20_000,))], config_fingerprint="fp")
        assert c.step == 8 and np.all(c.m == 8)


def test_growth_retry_replays_the_same_random_draws(tmp_path):
    """A transaction retried after growth must not consume extra random numbers."""
    big = [{"context": "c" * 3000 + str(i), "label": 1.0, "weight": 1.0} for i in range(300)]
    a, b = random.Random(5), random.Random(5)
    with Store(tmp_path / "tiny", map_size=64 * KiB) as s:
        s.reservoir_add(big, a)
        assert s.stats["grows"] >= 1
    with Store(tmp_path / "roomy") as s:
        s.reservoir_add(big, b)
    assert a.random() == b.random()


# --- one environment per process -----------------------------------------------------------------
def test_two_stores_share_one_environment(tmp_path):
    a = Store(tmp_path / "s")
    b = Store(tmp_path / "s")
    a.append_signals([sig(1)])
    assert b.last_seq() == 1
    a.close()
    assert b.append_signals([sig(2)]) == [(2, False)]  # still open: b holds a reference
    b.close()
    with pytest.raises(StoreError):
        b.last_seq()


def test_store_refuses_use_after_fork(tmp_path):
    s = Store(tmp_path / "s")
    s.append_signals([sig(1)])
    pid = os.fork()
    if pid == 0:  # child: must refuse, never touch the parent's environment
        try:
            s.last_seq()
            code = 1
        except StoreError as e:
            code = 7 if "fork" in str(e) else 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 7
    assert s.append_signals([sig(2)]) == [(2, False)]  # parent unaffected
    s.close()


# --- backup and inspect -------------------------------------------------------------------------
def test_backup_is_a_complete_consistent_copy(store, tmp_path):
    store.append_signals([sig(i) for i in range(50)])
    store.publish(3, np.ones(10, np.float32), step=9)
    z = np.zeros(N, np.float32)
    store.save_checkpoint(flat=z, m=z, v=z, step=9, last_trained_seq=50, layout=LAYOUT,
                          config_fingerprint="fp")
    info = backup(store.path, tmp_path / "bak")
    assert info["bytes"] > 0
    with pytest.raises(StoreError, match="already holds"):
        backup(store.path, tmp_path / "bak")
    with pytest.raises(StoreError):
        backup(store.path, store.path)
    store.close()
    assert backup(store.path, tmp_path / "bak2")["bytes"] > 0  # read-only, no Store open
    with Store(tmp_path / "bak2") as copy:
        assert copy.count_signals() == 50
    with Store(tmp_path / "bak") as copy:
        assert copy.count_signals() == 50 and copy.load_published()[0] == 3
        assert copy.load_checkpoint(layout=LAYOUT, config_fingerprint="fp").step == 9


def test_inspect_reports_counts_versions_step_and_sizes(store, tmp_path):
    store.append_signals([sig(i) for i in range(12)] + [
        {"context": "x", "decision": "block", "feedback": "false_positive"}])
    store.reservoir_add([ex(1, "false_negative"), ex(2)], random.Random(0))
    store.publish(2, np.ones(10, np.float32), step=5)
    z = np.zeros(N, np.float32)
    store.save_checkpoint(flat=z, m=z, v=z, step=5, last_trained_seq=13, layout=LAYOUT,
                          config_fingerprint="fp-1")
    store.append_metrics(5, {"loss": 0.3})
    store.flush()  # inspect shows what is committed
    info = inspect(store.path)
    assert info["signals"] == {"count": 13, "first_seq": 1, "last_seq": 13, "dedup_ids": 12}
    assert info["escalation_fingerprints"] == {"false_positive": 1, "false_negative": 0}
    assert info["replay"]["size"] == 2 and info["replay"]["locked"] == 1
    assert info["checkpoint"]["step"] == 5 and info["checkpoint"]["params"] == N
    assert info["published"]["version"] == 2 and info["published"]["kept_versions"] == [2]
    assert info["metrics"]["records"] == 1
    assert info["sizes"]["used_bytes"] <= info["sizes"]["file_bytes"] + 4096
    text = format_inspect(info)
    for needle in ("13 stored", "step 5", "version 2", "fp-1", "1 locked"):
        assert needle in text
    # read-only from a process that has no Store open
    store.close()
    assert inspect(store.path)["signals"]["count"] == 13
    with pytest.raises(StoreError, match="no gated state"):
        inspect(tmp_path / "missing")


def test_a_format_1_checkpoint_is_refused_by_name(store, monkeypatch):
    """Checkpoints from before source format 2 (DESIGN.md 1, revised) cannot be migrated:
    the daemon refuses them with the way out instead of loading misfit weights."""
    from gated.store import checkpoint as ckpt_module

    z = np.zeros(N, np.float32)
    monkeypatch.setattr(ckpt_module, "CHECKPOINT_FORMAT", 1)
    store.save_checkpoint(flat=z, m=z, v=z, step=3, last_trained_seq=0, layout=LAYOUT,
                          config_fingerprint="fp")
    monkeypatch.undo()
    with pytest.raises(CheckpointMismatch, match="format 1.*--reinit"):
        store.load_checkpoint(layout=LAYOUT, config_fingerprint="fp")


def test_pack_reuses_a_packer_per_thread_and_recovers_from_a_failed_record():
    """codec.pack keeps one msgpack Packer per thread: its bytes are packb's, a record
    that cannot be packed leaves nothing behind for the next one, threads do not share
    a buffer, and a Packer that packed something large is dropped (its buffer would
    stay that large)."""
    import msgpack

    from gated.store import codec

    rec = {"context": "fs.read {\"path\": \"/etc/hosts\"}", "label": 1.0, "h": ["a", "b"],
           "arr": np.arange(3)}
    expected = msgpack.packb(rec, use_bin_type=True, default=codec._default)
    assert codec.pack(rec) == expected
    with pytest.raises(TypeError, match="cannot store a value of type object"):
        codec.pack({"context": "x" * 100, "bad": object()})
    assert codec.pack(rec) == expected  # no leftover bytes of the failed record
    assert codec.unpack(codec.pack(rec))["arr"] == [0, 1, 2]

    results: dict[int, list[bytes]] = {}

    def worker(k: int) -> None:
        results[k] = [codec.pack({"k": k, "i": i, "pad": "y" * (i % 50)}) for i in range(2000)]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, packed in results.items():
        assert [codec.unpack(b)["k"] for b in packed] == [k] * 2000
        assert [codec.unpack(b)["i"] for b in packed] == list(range(2000))

    codec.pack(rec)
    kept = codec._PACKERS.packer
    assert codec.pack(rec) and codec._PACKERS.packer is kept  # reused
    big = codec.pack({"blob": b"z" * (codec._KEEP_PACKER_BELOW + 1)})
    assert len(big) > codec._KEEP_PACKER_BELOW
    assert not hasattr(codec._PACKERS, "packer")  # dropped after the large one
    assert codec.pack(rec) == expected
