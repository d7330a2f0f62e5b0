"""The durable store against real LMDB environments in temporary directories: the signal
log, the replay reservoir, metrics history, retention, map growth, one environment per
process. Group commit: test_store_commit.py; checkpoints, snapshots, backup and inspect:
test_store_checkpoint.py."""

from __future__ import annotations

import os
import random
import threading
import time

import numpy as np
import pytest
from store_examples import LAYOUT, N, ex, sig

from gated.signals import SignalError, WeightTable
from gated.store import Store, StoreError, inspect

KiB = 1024


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


# --- replay reservoir ---------------------------------------------------------------------------

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
