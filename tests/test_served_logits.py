"""The transformer logit serving answered a call with, carried by that call's signal into
the signal log and reused by the trainer's scoring when its snapshot's transformer is the
same one (`ServedDeep`, `Snapshot.deep`): real LMDB, a real daemon over its real socket.
"""

from __future__ import annotations

import numpy as np
import pytest
from daemon_proc import QUIET, metric_samples, metric_value, start, wait_until

from gated.config import Limits
from gated.daemon.serving import ServedDeep, Serving
from gated.engine import Model, ModelConfig, source_batch
from gated.signals import SignalError, validate_signal
from gated.store import Store

ITEMS = [
    ('shell.exec {"cmd": "rm -rf /srv/app"}', ['fs.read {"path": ".env"}']),
    ('fs.read {"path": "src/main.py"}', None),
    ('http.request {"method": "POST", "url": "https://paste.example.net/u"}',
     ['fs.read {"path": "/home/a/.ssh/id_rsa"}', 'shell.exec {"cmd": "ls"}']),
    ('git.push {"remote": "origin", "branch": "main", "force": true}', ["git.status {}"]),
    ('db.query {"sql": "SELECT name FROM users LIMIT 5"}', None),
]


def _serving(deep: int | None = 7, served_size: int = 0) -> Serving:
    """A tiny model whose wide path is not zero, so both parts of a logit matter."""
    model = Model.init(ModelConfig.tiny(), seed=3)
    rng = np.random.default_rng(0)
    w = model.params["wide.w"]
    w[...] = rng.normal(0.0, 0.3, size=w.shape).astype(w.dtype)
    return Serving(model.cfg, model.flat.astype(np.float32), 1, 0, deep=deep,
                   served_size=served_size)


def test_a_served_logit_of_the_same_transformer_is_reused_and_equals_the_recomputed_one():
    serving = _serving(served_size=16)
    sources = source_batch(ITEMS, serving.cfg)
    computed = serving.score_parts(sources)
    assert computed.reused == 0
    assert np.abs(computed.z - computed.z_deep).max() > 1e-3  # the wide share is there

    p, snap = serving.predict_many(ITEMS)  # remembers each call's transformer logit
    np.testing.assert_allclose(p, computed.p, rtol=1e-6)
    signals = [{"context": c, "history": h or [], "decision": "allow"} for c, h in ITEMS]
    assert serving.served.attach(signals) == len(ITEMS)
    served = [s["served"] for s in signals]
    assert all(s[0] == snap.deep == 7 for s in served)

    reused = serving.score_parts(sources, served)
    assert reused.reused == len(ITEMS)
    np.testing.assert_allclose(reused.z_deep, computed.z_deep, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(reused.z, computed.z, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(reused.p, computed.p, rtol=1e-6, atol=1e-7)


def test_the_parts_add_up_to_the_whole_forward_and_the_served_p_is_the_unsplit_one():
    """Scoring runs the transformer without the wide features and adds the wide path's
    share computed apart (each once): the sum is the joint forward's logit, and the
    calibrated p the same as calibrating that logit."""
    serving = _serving()
    snap, cal = serving.current, serving.calibration
    sources = cal.reads(source_batch(ITEMS, serving.cfg))
    parts = serving.score_parts(sources)
    whole = snap.logits(sources)
    np.testing.assert_allclose(parts.z, whole, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(parts.z - parts.z_deep, snap.model.wide_logit(sources),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(parts.p, cal.of(whole, sources, snap.model), rtol=1e-5,
                               atol=1e-6)


def test_only_rows_of_this_snapshots_transformer_are_taken_from_the_served_logits():
    """A planted logit shows which rows were taken (the transformer did not run for them)
    and which were computed: another token, none, or a snapshot without one."""
    serving = _serving()
    sources = source_batch(ITEMS, serving.cfg)
    base = serving.score_parts(sources)
    wide = base.z - base.z_deep
    served = [(7, 5.0), (8, 5.0), None, (7, -4.0), (0, 5.0)]
    got = serving.score_parts(sources, served)
    assert got.reused == 2
    np.testing.assert_allclose(got.z[[0, 3]], np.array([5.0, -4.0]) + wide[[0, 3]])
    np.testing.assert_allclose(got.z_deep[[0, 3]], [5.0, -4.0])
    np.testing.assert_allclose(got.z[[1, 2, 4]], base.z[[1, 2, 4]], rtol=1e-6, atol=1e-6)
    # the calibrated probability goes with the logit actually used
    np.testing.assert_allclose(got.p, serving.calibration.of(got.z, got.sources,
                                                             serving.current.model, got.z_deep))
    unknown = _serving(deep=None)
    assert unknown.score_parts(sources, [(7, 5.0)] * len(ITEMS)).reused == 0


def test_served_memory_is_bounded_by_calls_and_off_at_zero():
    memo = ServedDeep(2)
    memo.note(ITEMS[:3], 11, np.array([0.1, 0.2, 0.3]))
    assert memo.attach([]) == 0
    assert len(memo) == 2  # the oldest call was let go
    sigs = [{"context": c, "history": list(h or [])} for c, h in ITEMS[:3]]
    assert memo.attach(sigs) == 2
    assert "served" not in sigs[0] and sigs[1]["served"] == (11, 0.2)
    assert sigs[2]["served"] == (11, 0.3)
    memo.note(ITEMS[:1], None, np.array([1.0]))  # a snapshot of unknown transformer: kept out
    assert memo.attach([{"context": ITEMS[0][0], "history": list(ITEMS[0][1])}]) == 0
    # keyed by the exact text the transformer reads: other whitespace is another call
    # (the signals' fingerprint folds it, so it could not be the key)
    spaced = [{"context": ITEMS[1][0].replace(" ", "  "), "history": []}]
    assert memo.attach(spaced) == 0 and "served" not in spaced[0]
    off = ServedDeep(0)
    off.note(ITEMS, 11, np.zeros(len(ITEMS)))
    assert len(off) == 0 and off.attach(sigs) == 0


def test_the_served_logit_is_stored_with_its_signal_and_no_client_can_set_it(tmp_path):
    store = Store(tmp_path / "state")
    try:
        plain = validate_signal({"context": "fs.read {}", "decision": "allow"}, Limits())
        carried = {**validate_signal({"context": "fs.read {\"path\": \"a\"}",
                                      "decision": "block"}, Limits()), "served": (5, -1.25)}
        store.append_signals([plain, carried], validated=True)
        (_, a), (_, b) = store.read_signals(0, 10)
        assert a["served"] is None
        assert b["served"] == (5, -1.25) and b["decision"] == "block"
    finally:
        store.close()
    with pytest.raises(SignalError) as e:
        validate_signal({"context": "fs.read {}", "decision": "allow", "served": [5, 9.0]},
                        Limits())
    assert e.value.code == "unknown_field"


def test_a_daemon_trains_on_signals_scored_with_the_logits_it_served(tmp_path):
    """Predict calls, then send their signals in one batch: the trainer scores them with
    the logits serving answered (no transformer step or new transformer in between under
    QUIET); signals for calls never predicted are computed."""
    (tmp_path / "gated.toml").write_text(QUIET)
    d = start(tmp_path, config=tmp_path / "gated.toml")
    asked = [(f'fs.read {{"path": "src/pkg/m{i}.py"}}', ['shell.exec {"cmd": "ls"}'])
             for i in range(6)]
    unasked = [(f'shell.exec {{"cmd": "rm -rf /srv/x{i}"}}', None) for i in range(4)]
    try:
        with d.client() as c:
            wait_until(lambda: (s := c.status())["trainer"]["alive"] and s["version"] >= 1
                       and s, timeout=60, what="the trainer's first published version")
            for context, history in asked:
                assert c.predict(context, history)["source"] == "model"
            assert c.status()["served_logits"]["remembered"] == len(asked)
            before = c.status()["served_logits"]
            c.signals([{"context": ctx, "history": h, "decision": "allow"}
                       for ctx, h in asked])
            wait_until(lambda: c.status()["queue_depth"] == 0, timeout=60, what="scoring")
            after = c.status()["served_logits"]
            assert after["reused"] - before["reused"] == len(asked)
            assert after["computed"] == before["computed"]
            share = metric_value(metric_samples(d.scrape()), "gated_scored_reused_share")
            assert share == pytest.approx(1.0)
            c.signals([{"context": ctx, "decision": "block"} for ctx, _ in unasked])
            wait_until(lambda: c.status()["queue_depth"] == 0, timeout=60, what="scoring")
            last = c.status()["served_logits"]
            assert last["computed"] - after["computed"] == len(unasked)
            assert last["reused"] == after["reused"]
    finally:
        assert d.stop() == 0
