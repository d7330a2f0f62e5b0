"""Checkpoints, published snapshots, backup and inspect against a real LMDB store: round trips
in float64, mismatches named, a save that dies midway leaves the last checkpoint."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
from store_examples import LAYOUT, N, ex, sig

from gated.store import (
    CheckpointMismatch,
    Store,
    StoreError,
    StoreFullError,
    backup,
    format_inspect,
    inspect,
    load_published,
)
from gated.store.env import close_readers

# --- checkpoint ---------------------------------------------------------------------------------


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
