"""The online trainer against a real LMDB store: progressive validation, rollback, swap,
resume, policy drift."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gated.config import TrainConfig
from gated.daemon.serving import Calibration
from gated.daemon.trainer import AlignmentWindow, TrainerEvents, build_trainer
from gated.daemon.trainer.wide_path import early_block_weight
from gated.engine import ModelConfig, source_batch
from gated.engine.wide_learner import NO_DOUBT
from gated.online.drift import AlarmRecheck
from gated.store import Store


def _trainer(tmp_path, **kw):
    store = Store(tmp_path / "state")
    # no held-back slice here (tests/test_promotion.py covers it): every signal trains
    kw.setdefault("promotion_holdout_share", 0.0)
    settings = dataclasses.replace(TrainConfig(), lr=3e-3, swap_every_steps=2, **kw)
    trainer, serving = build_trainer(store, ModelConfig.tiny(), settings, seed=0)
    return store, trainer, serving


def _sig(context: str, decision: str, **extra) -> dict:
    return {"context": context, "decision": decision, **extra}


def test_alignment_window_and_confusion_positive_is_block():
    w = AlignmentWindow(4)
    w.add(0.9, 1.0)   # predicted allow, truth allow: tn
    w.add(0.2, 0.0)   # predicted block, truth block: tp
    w.add(0.3, 1.0)   # predicted block, truth allow: fp
    w.add(0.8, 0.0)   # predicted allow, truth block: fn
    assert w.confusion() == {"tp": 1, "fp": 1, "tn": 1, "fn": 1}
    assert w.alignment == 0.5 and w.full and not w.converged(0.95)
    w.add(0.1, 0.0)  # slides: the first (tn) leaves
    assert w.confusion() == {"tp": 2, "fp": 1, "tn": 0, "fn": 1} and len(w.items) == 4


def test_scores_before_training_swaps_and_publishes(tmp_path):
    store, trainer, serving = _trainer(tmp_path)
    store.append_signals([_sig(f"bash ls {i}", "allow") for i in range(40)])
    before = serving.current
    while trainer.status.last_trained_seq < 40:
        trainer.train_on(store.read_signals(trainer.status.last_trained_seq, 16))
    assert trainer.window.total_scored == 40
    assert trainer.status.version >= 1 and serving.current is not before
    version, flat = store.load_published()
    assert version == trainer.status.version
    np.testing.assert_array_equal(flat, serving.current.model.flat)
    store.close()


def test_non_finite_step_is_rolled_back_and_never_published(tmp_path):
    store, trainer, serving = _trainer(tmp_path)
    store.append_signals([_sig(f"bash ls {i}", "allow") for i in range(8)])
    trainer.train_on(store.read_signals(0, 8))
    trainer._maybe_swap(force=True)
    good_version, good_flat = store.load_published()
    trainer.model.flat[5] = np.nan  # a diverged step's weights
    store.append_signals([_sig("bash rm -rf /", "block")])
    trainer.train_on(store.read_signals(trainer.status.last_trained_seq, 8))
    assert trainer.status.rollbacks == 1
    assert np.isfinite(trainer.model.flat).all()
    np.testing.assert_array_equal(trainer.model.flat, good_flat)
    assert trainer._maybe_swap(force=True) is False  # nothing new to publish
    assert store.load_published()[0] == good_version
    assert np.isfinite(serving.current.model.flat).all()
    store.close()


def test_checkpoint_resume_is_exact(tmp_path):
    store, trainer, _ = _trainer(tmp_path)
    store.append_signals([_sig(f"write_file src/{i}.py", "allow") for i in range(20)])
    while trainer.status.last_trained_seq < 20:
        trainer.train_on(store.read_signals(trainer.status.last_trained_seq, 16))
    trainer.checkpoint()
    flat, m, t = trainer.model.flat.copy(), trainer.opt.m.copy(), trainer.opt.t
    step = trainer.status.step
    store.close()
    store2 = Store(tmp_path / "state")
    t2, _ = build_trainer(store2, ModelConfig.tiny(), TrainConfig(), seed=0)
    assert t2.status.step == step and t2.status.last_trained_seq == 20 and t2.opt.t == t
    assert list(t2.window.items) == list(trainer.window.items) and len(t2.window.items) == 20
    assert t2.window.total_scored == 0  # counts this run's scoring only
    np.testing.assert_array_equal(t2.model.flat, flat)
    np.testing.assert_array_equal(t2.opt.m, m)
    assert store2.read_signals(t2.status.last_trained_seq, 10) == []  # nothing to re-train
    store2.close()


def test_replay_skips_examples_contradicted_by_a_newer_signal(tmp_path):
    store, trainer, _ = _trainer(tmp_path, replay_fraction=0.5)
    store.append_signals([_sig("http_get https://x.example", "allow"),
                          _sig("bash ls", "allow"),
                          _sig("read_file /etc/passwd", "block", feedback="false_positive")])
    trainer.train_on(store.read_signals(0, 16))
    old = store.reservoir_sample(10, trainer.rng)
    assert len(old) == 3
    # The policy changes: the same download is now blocked.
    store.append_signals([_sig("http_get https://x.example", "block"),
                          _sig("read_file /etc/passwd", "block")])
    trainer.latest.note([{"context": "http_get https://x.example", "label": 0.0},
                          {"context": "read_file /etc/passwd", "label": 0.0}])
    kept = trainer.latest.current(old)
    contexts = {(e["context"], e["label"]) for e in kept}
    assert ("http_get https://x.example", 1.0) not in contexts  # stale label dropped
    assert ("bash ls", 1.0) in contexts  # no newer signal: kept
    assert ("read_file /etc/passwd", 1.0) in contexts  # locked correction: always kept
    store.close()


class _Counts(TrainerEvents):
    def __init__(self) -> None:
        self.backpropagated = 0
        self.drifts: list[int] = []
        self.verdicts: list[tuple[int, bool, int]] = []

    def on_scored(self, window, converged, stats=None, backpropagated=0) -> None:
        self.backpropagated += backpropagated

    def on_drift(self, began_seq: int) -> None:
        self.drifts.append(began_seq)

    def on_drift_verdict(self, began_seq: int, confirmed: bool, dropped: int) -> None:
        self.verdicts.append((began_seq, confirmed, dropped))


def test_selective_backprop_skips_what_serving_already_knows_never_a_correction(tmp_path):
    store, trainer, serving = _trainer(tmp_path, selective_confidence=0.9, selective_keep=0.0)
    trainer.events = counts = _Counts()
    serving.calibration = Calibration(1.0, 30.0)  # serving says "allow" with p ~ 1
    store.append_signals([_sig(f"fs.read src/{i}.py", "allow") for i in range(6)])
    assert trainer.train_on(store.read_signals(0, 64)) is None  # nothing worth a gradient
    assert trainer.status.step == 0 and trainer.status.last_trained_seq == 6
    assert store.reservoir_size() == 6  # skipped, yet kept for replay
    store.append_signals([_sig("fs.read src/0.py", "block", feedback="override_allow"),
                          _sig("db.query DROP TABLE users", "block")])
    trainer.train_on(store.read_signals(6, 64))
    # the override (a correction) and the block serving got wrong: both back-propagated
    assert counts.backpropagated == 2 and trainer.status.step == 1
    store.close()


def test_a_correction_supersedes_the_replayed_example_of_that_call(tmp_path):
    store, trainer, _ = _trainer(tmp_path)
    hist = ['fs.read {"path": "/w/.env"}']
    store.append_signals([_sig("email.send to@ext.example", "allow", history=hist),
                          _sig("email.send to@ext.example", "allow", history=["ls"])])
    trainer.train_on(store.read_signals(0, 64))
    store.append_signals([_sig("email.send to@ext.example", "allow", history=hist,
                               feedback="false_negative")])
    trainer.train_on(store.read_signals(2, 64))
    held = {(e["context"], tuple(e["history"])): (e["label"], e["locked"])
            for e in store.reservoir_sample(10, trainer.rng)}
    assert held == {("email.send to@ext.example", tuple(hist)): (0.0, True),
                    ("email.send to@ext.example", ("ls",)): (1.0, False)}
    store.close()


def _drift_at_22(tmp_path):
    """20 allows, a person's correction, then 5 blocks of the same kind of call from signal
    22 on, and a drift alarm that says the change began there (what `Monitor.observe`
    reports when Page-Hinkley fires)."""
    store, trainer, _ = _trainer(tmp_path)
    trainer.events = counts = _Counts()
    store.append_signals([_sig(f"http.request GET h{i}", "allow") for i in range(20)])
    store.append_signals([_sig("pkg.install reqeusts", "allow", feedback="false_positive")])
    trainer.train_on(store.read_signals(0, 64))
    store.append_signals([_sig(f"http.request GET n{i}", "block") for i in range(5)])
    trainer.train_on(store.read_signals(21, 64))
    trainer._on_drift(22, 26)
    return store, trainer, counts


_SINCE_22 = {"pkg.install reqeusts"} | {f"http.request GET n{i}" for i in range(5)}


def test_a_drift_alarm_sets_stale_replay_aside_and_its_confirmation_drops_it(tmp_path):
    store, trainer, counts = _drift_at_22(tmp_path)
    assert store.reservoir_size() == 26  # waiting for the verdict: kept, not replayed
    replayed = {e["context"] for e in trainer._wide_replay(100)[0]}
    assert replayed == _SINCE_22  # the correction (locked) is never set aside
    trainer._on_drift_verdict(22, True)
    assert {e["context"] for e in store.reservoir_sample(100, trainer.rng)} == _SINCE_22
    assert counts.drifts == [22] and counts.verdicts == [(22, True, 20)]
    assert trainer.replay_floor == 0  # nothing left to set aside
    store.close()


def test_a_withdrawn_drift_alarm_keeps_the_replay_and_replays_it_again(tmp_path):
    store, trainer, counts = _drift_at_22(tmp_path)
    trainer._on_drift_verdict(22, False)
    assert store.reservoir_size() == 26 and counts.verdicts == [(22, False, 0)]
    replayed = {e["context"] for e in trainer._wide_replay(100)[0]}
    assert replayed == _SINCE_22 | {f"http.request GET h{i}" for i in range(20)}
    store.close()


def test_a_resumed_trainer_acts_on_an_alarm_that_was_waiting(tmp_path):
    """The run the recheck needs is not checkpointed: at a resume the alarm stands and the
    stale replay is dropped before any step could replay it."""
    store, trainer, _ = _drift_at_22(tmp_path)
    trainer.monitor.drift_check.recheck = AlarmRecheck(trainer.monitor.drift, [], [], {}, 22, 50)
    trainer.checkpoint()
    resumed, _ = build_trainer(store, trainer.model.cfg, trainer.settings)
    assert {e["context"] for e in store.reservoir_sample(100, resumed.rng)} == _SINCE_22
    assert not resumed.monitor.drift_pending
    store.close()


def test_turns_between_chunks_take_and_publish_the_signals_that_arrive_during_a_step(tmp_path):
    """`wide_turns`: a transformer step stops after each chunk; the signals appended to the
    real log meanwhile are scored, learnt by the wide path and published mid-step (the
    transformer's part of that publication is the one from before the step), and their
    informative ones train in the next step."""
    store, trainer, serving = _trainer(tmp_path, batch_size=16, step_chunk_rows=4,
                                       swap_every_seconds=1e-6)
    swaps: list[tuple[int, bool]] = []

    class Events(TrainerEvents):
        def on_swap(self, version: int) -> None:
            swaps.append((version, trainer._in_step))
    trainer.events = Events()
    store.append_signals([_sig(f"fs.read src/{i}.py", "allow") for i in range(16)])
    arrivals = [_sig(f"shell.exec rm -rf /srv/data{i}", "block") for i in range(6)]
    deep = trainer.model.deep_size
    at_first_turn: list[np.ndarray] = []

    def arrive() -> None:  # what the daemon's log does while the trainer works
        if not at_first_turn:
            at_first_turn.append(trainer.model.flat.copy())
            store.append_signals(arrivals)
        else:
            at_first_turn.append(None)
    trainer.before_turn = arrive
    trainer.train_on(store.read_signals(0, 16), turns=True)

    assert len(at_first_turn) == 4  # 16 rows in chunks of 4
    assert trainer.status.last_trained_seq == 22  # the arrivals were taken mid-step
    assert {seq for seq, *_ in trainer.take_scores()} == set(range(1, 23))
    mid = [v for v, in_step in swaps if in_step]
    assert mid, "the wide path's progress was published in the middle of the step"
    published = store.load_published_version(mid[0])
    np.testing.assert_array_equal(published[:deep], at_first_turn[0][:deep])
    assert np.any(published[deep:] != at_first_turn[0][deep:])  # learnt the arrivals
    assert np.any(trainer.model.flat[:deep] != at_first_turn[0][:deep])  # the step ran
    assert trainer.status.step == 1 and trainer.candidates_waiting == 6
    trainer.train_on([], turns=True)  # the next step trains them, not a replay-only one
    assert trainer.status.step == 2 and trainer.candidates_waiting == 0
    store.close()


@pytest.mark.parametrize(("turn_rows", "turns_taken"), [(4, 4), (0, 2), (16, 2)])
def test_turns_come_every_wide_turn_rows_rows(tmp_path, turn_rows, turns_taken):
    """`wide_turn_rows` caps the chunks of a step that takes turns (at 0, or above
    `step_chunk_rows`, the chunks stay at `step_chunk_rows`)."""
    store, trainer, _ = _trainer(tmp_path, batch_size=16, step_chunk_rows=8,
                                 wide_turn_rows=turn_rows)
    called = []
    trainer.before_turn = lambda: called.append(1)
    store.append_signals([_sig(f"fs.read src/{i}.py", "allow") for i in range(16)])
    trainer.train_on(store.read_signals(0, 16), turns=True)
    assert len(called) == turns_taken and trainer.status.step == 1
    store.close()


def test_without_turns_a_step_does_not_stop_for_new_signals(tmp_path):
    store, trainer, _ = _trainer(tmp_path, batch_size=16, step_chunk_rows=4)
    called = []
    trainer.before_turn = lambda: called.append(1)
    store.append_signals([_sig(f"fs.read src/{i}.py", "allow") for i in range(16)])
    trainer.train_on(store.read_signals(0, 16))
    assert not called and trainer.status.last_trained_seq == 16 and trainer.status.step == 1
    store.close()


def test_the_transformer_starts_with_no_share_of_the_served_logit(tmp_path):
    """With a wide path the served logit is the wide path's alone until a calibration fit
    on the progressive stream shows the transformer's part earns a share."""
    store, trainer, serving = _trainer(tmp_path)
    assert trainer.wide_path.learner is not None
    store.append_signals([_sig(f"fs.read src/{i}.py", "allow") for i in range(16)])
    trainer.train_on(store.read_signals(0, 16))
    # (allow_open False: 16 signals scored, fewer than train.allow_band_after)
    assert serving.calibration == Calibration(1.0, 0.0, -1.0, allow_open=False)
    assert trainer.monitor.stats()["calibration_d"] == -1.0
    trainer.publish_now()  # what the step and the wide path learned now serves
    z, p, snap = serving.score_many([("fs.read src/x.py", None)])
    wide = snap.model.wide_logit(source_batch([("fs.read src/x.py", None)], snap.model.cfg))
    assert abs(z[0] - wide[0]) > 1e-6  # the transformer's part is there, and not served
    np.testing.assert_allclose(p, 1 / (1 + np.exp(-wide)), rtol=1e-9)
    store.close()


def test_early_block_weight_fades_to_one_and_spares_allows_and_corrections():
    """`train.wide_early_block_weight` W over `wide_early_block_signals` N: an ordinary
    block at signal 1 weighs W, halfway through (W + 1) / 2, from signal N on 1; an
    allow, a correction and a setting of 1 or N = 0 are never scaled."""
    assert early_block_weight(1, 0.0, True, 3.0, 10) == 3.0
    assert early_block_weight(6, 0.0, True, 3.0, 10) == 2.0  # (1 - 5/10) of the way
    assert early_block_weight(10, 0.0, True, 3.0, 10) == pytest.approx(1.2)
    assert early_block_weight(11, 0.0, True, 3.0, 10) == 1.0
    assert early_block_weight(1, 1.0, True, 3.0, 10) == 1.0  # allow
    assert early_block_weight(1, 0.0, False, 3.0, 10) == 1.0  # a correction
    assert early_block_weight(1, 0.0, True, 1.0, 10) == 1.0
    assert early_block_weight(1, 0.0, True, 3.0, 0) == 1.0


def test_the_wide_path_weighs_early_blocks_up_in_first_and_second_looks(tmp_path):
    """In the trainer: the first look of an ordinary block at signal s learns at
    W (1 - (s - 1) / N) + (s - 1) / N times its weight, its second look the same at the
    signal that brings it, a correction at its own weight, an allow at 1; past N nothing
    is scaled (a spy passes every call through to the real learner)."""
    store, trainer, _ = _trainer(tmp_path, wide_second_look=2, wide_early_block_weight=3.0,
                                 wide_early_block_signals=4)
    seen: list[tuple[float, float]] = []
    learn = trainer.wide_path.learner.learn

    def spy(idx, val, z_rest, label, weight, pair=None, pair_hold=0.0, doubt=NO_DOUBT,
            novel_at=-1):
        seen.append((label, weight))
        return learn(idx, val, z_rest, label, weight, pair, pair_hold, doubt, novel_at)

    trainer.wide_path.learner.learn = spy
    trainer.monitor.calibrator.burn_in = 0  # keep every calibration pair here
    store.append_signals([_sig("rm -rf /", "block"),  # 1: weight 3
                          _sig("ls a", "allow"),  # 2
                          _sig("ls b", "block", feedback="false_negative"),  # 3: its own 4
                          _sig("rm -rf ~", "block"),  # 4: 1 + 2 (1 - 3/4) = 1.5
                          _sig("rm -rf /x", "block")])  # 5: past N
    trainer.train_on(store.read_signals(0, 64))
    assert seen == [(0.0, 3.0), (1.0, 1.0),
                    (0.0, 4.0), (0.0, 1.0 + 2.0 * (1 - 2 / 4)),  # signal 1's second look at 3
                    (0.0, 1.5), (1.0, 1.0),  # signal 2's second look at 4
                    (0.0, 1.0), (0.0, 1.0)]  # past N: 5, and signal 3's second look
    # each calibration pair carries the weight a block of its signal has (an allow's
    # too, for a correction that relabels it; a correction's own pair 1)
    assert list(trainer.monitor.calibrator.bw) == [3.0, 2.5, 1.0, 1.5, 1.0]
    store.close()


def test_a_drift_alarm_takes_the_new_policys_second_looks_at_once_unless_turned_off(tmp_path):
    """`drift_look_now` (hot): at an alarm the wide path learns at once the waiting second
    looks from the change's estimated start to the signal that raised it; the earlier
    ones (the old policy's) are dropped either way, and with the setting off the new
    policy's wait for their schedule. Counted through the real learner's `learn`."""
    store, trainer, _ = _trainer(tmp_path, wide_second_look=10, drift_look_now=True)
    calls = []
    learn = trainer.wide_path.learner.learn

    def counting(*a, **kw):
        calls.append(a[3])  # the label learned
        return learn(*a, **kw)

    trainer.wide_path.learner.learn = counting
    evidence_given = []
    evidence = trainer.wide_path.learner.alarm_evidence

    def recording(looks):  # the looks' rows, read before they are learned
        evidence_given.append([(len(idx), label) for idx, _val, label, _novel in looks])
        return evidence(looks)

    trainer.wide_path.learner.alarm_evidence = recording
    store.append_signals([_sig(f"ls {k}", "allow" if k < 3 else "block") for k in range(6)])
    trainer.train_on(store.read_signals(0, 64))
    assert len(calls) == 6 and len(trainer.wide_path.second_look) == 6
    trainer._on_drift(4, 5)  # began at signal 4 (1-based), seen at 5: signal 6's waits
    assert calls[6:] == [0.0, 0.0] and len(trainer.wide_path.second_look) == 1
    assert [label for _, label in evidence_given[0]] == [0.0, 0.0]
    assert all(n > 0 for n, _ in evidence_given[0])  # each look's features
    assert trainer.wide_path.dirty and "taken now" in trainer.wide_path.drift_note(False)
    assert "once 2 labels have gone against them, each of the alarm's looks" in (
        trainer.wide_path.drift_note(False))  # the decay's votes, told to the operator
    trainer.apply_settings(dataclasses.replace(trainer.settings, drift_look_now=False))
    trainer._on_drift(6, 6)
    assert calls[8:] == [] and len(trainer.wide_path.second_look) == 1
    assert len(evidence_given) == 1  # no looks taken, no evidence read
    assert "taken now" not in trainer.wide_path.drift_note(False)  # the operator's log
    store.close()


def test_the_wide_path_takes_a_second_look_at_each_signal_under_its_corrected_label(tmp_path):
    """`wide_second_look`: every signal the wide path learned is learned once more that
    many signals later, at weight 1, under the newest label of its (context, history);
    a drift drops the pending looks from before the change. A first look holds the pair
    term's contradicted "allow" (`wide_pair_hold`), a second look never does, and
    without a second look nothing is held. Only a second look whose label is still the
    gate's own gets the doubt (`wide_doubt_weight`, `_logits`); a first look and a look
    under a correction's label never do. The learner's calls are recorded (a spy that
    passes every call through to the real WideAdaGrad)."""
    # blocks at their own weight here (the early weight: the next test)
    store, trainer, _ = _trainer(tmp_path, wide_second_look=3, wide_pair_hold=2.5,
                                 wide_early_block_weight=1.0, wide_doubt_weight=0.5,
                                 wide_doubt_logits=4.0, drift_look_now=False)
    seen: list[tuple[str, float, float]] = []
    holds: list[float] = []
    doubts: list[tuple[float, float]] = []
    learn, rows = trainer.wide_path.learner.learn, {}

    def spy(idx, val, z_rest, label, weight, pair=None, pair_hold=0.0, doubt=NO_DOUBT,
            novel_at=-1):
        seen.append((rows.get(float(np.sum(val)), "?"), label, weight))
        holds.append(pair_hold)
        doubts.append(doubt)
        return learn(idx, val, z_rest, label, weight, pair, pair_hold, doubt, novel_at)

    trainer.wide_path.learner.learn = spy
    calls = ['email.send {"to": "x@ext.example"}', "ls a", "ls bb", "ls ccc"]
    hist = ['fs.read {"path": "/w/.env"}']
    for c in calls:  # tell the calls apart by their features
        b = source_batch([(c, hist if c.startswith("email") else None)], trainer.model.cfg)
        rows[float(np.sum(b["wide_val"][0]))] = c.split()[0] + c[-1]
    store.append_signals([_sig(calls[0], "allow", history=hist),  # the gate's mistake
                          _sig(calls[0], "allow", history=hist, feedback="false_negative"),
                          *[_sig(c, "allow") for c in calls[1:]]])
    trainer.train_on(store.read_signals(0, 64))
    mail, a, b, c = (c.split()[0] + c[-1] for c in calls)
    assert seen == [(mail, 1.0, 1.0), (mail, 0.0, 4.0), (a, 1.0, 1.0), (b, 1.0, 1.0),
                    (mail, 0.0, 1.0),  # the mistake's second look: the corrected label
                    (c, 1.0, 1.0), (mail, 0.0, 1.0)]  # the correction's own second look
    assert holds == [2.5, 2.5, 2.5, 2.5, 0.0, 2.5, 0.0]  # first looks held, second not
    assert doubts == [NO_DOUBT] * 7  # the mail's looks are under its correction's label
    assert len(trainer.wide_path.second_look) == 3
    trainer._on_drift(5, 6)  # a change began at signal 5: the looks of 3 and 4 are stale
    assert len(trainer.wide_path.second_look) == 1  # 5's waits (drift_look_now off)
    trainer.apply_settings(dataclasses.replace(trainer.settings, wide_second_look=0))
    holds.clear()
    (seq, _), = store.append_signals([_sig("ls dddd", "allow")])
    trainer.train_on(store.read_signals(seq - 1, 64))
    assert holds == [0.0]  # no second look to learn it later: nothing is held
    store.close()


def test_an_uncorrected_second_look_gets_the_doubt_and_a_corrected_one_does_not(tmp_path):
    """`wide_doubt_weight`, `_logits`: the second look of a call whose newest label is the
    gate's own is learned with the doubt (WideAdaGrad applies it only to an "allow" its
    pair term contradicts: test_wide_pair.py); one whose call a person corrected since, even
    to "allow", is not, and a gate decision after the correction makes it the gate's
    again (a spy records what the wide path asks of the real learner)."""
    store, trainer, _ = _trainer(tmp_path, wide_second_look=2, wide_early_block_weight=1.0,
                                 wide_doubt_weight=0.5, wide_doubt_logits=4.0)
    looks: list[tuple[float, tuple[float, float]]] = []
    learn = trainer.wide_path.learner.learn

    def spy(idx, val, z_rest, label, weight, pair=None, pair_hold=0.0, doubt=NO_DOUBT,
            novel_at=-1):
        looks.append((label, doubt))
        return learn(idx, val, z_rest, label, weight, pair, pair_hold, doubt, novel_at)

    trainer.wide_path.learner.learn = spy
    store.append_signals([_sig("ls a", "allow"),  # 1: the gate's allow, never corrected
                          _sig("rm b", "block"),  # 2: the gate's block ...
                          _sig("rm b", "block", feedback="false_positive"),  # 3: a person
                          _sig("ls c", "allow"), _sig("ls d", "allow")])
    trainer.train_on(store.read_signals(0, 64))
    doubt = (0.5, 4.0)
    second = [look for n, look in enumerate(looks) if n in (3, 5, 7)]  # 1's, 2's, 3's looks
    assert second == [(1.0, doubt), (1.0, NO_DOUBT), (1.0, NO_DOUBT)]
    assert all(d == NO_DOUBT for n, (_, d) in enumerate(looks) if n not in (3, 5, 7))
    looks.clear()
    store.append_signals([_sig("rm b", "allow"),  # 6: the gate allows the call itself now
                          _sig("ls e", "allow"), _sig("ls f", "allow")])
    trainer.train_on(store.read_signals(5, 64))
    # first looks of 6, 7, 8, each followed by a second look due: 4's, 5's, and 6's, the
    # gate's own label again
    assert [d for _, d in looks] == [NO_DOUBT, doubt, NO_DOUBT, doubt, NO_DOUBT, doubt]
    store.close()
