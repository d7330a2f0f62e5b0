"""The n-grams read scaled by their familiarity (`ModelConfig.wide_familiarity`,
engine/wide_logit.py `familiar_values`): the arithmetic, the batch that carries where the
n-grams end, exact gradients through the model's forward, the same logit wherever a
decision is made (the model, the inference plan, the wide learner), and serving reading
them unscaled while the trainer adapts to a drift alarm."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from config_history import fingerprint_before
from gradcheck import numeric_grad_entries, rel_error

from gated.config import TrainConfig
from gated.daemon.serving import Calibration, Serving
from gated.daemon.trainer import build_trainer
from gated.engine import Model, ModelConfig, build_batch
from gated.engine.infer import InferencePlan
from gated.engine.tokenizer import encode_source, source_batch
from gated.engine.wide import NGRAM_END, PAIR_KEYS, wide_features
from gated.engine.wide_learner import WideAdaGrad, WideBag
from gated.engine.wide_logit import familiar_values, member_offsets, shifted
from gated.store import Store

TOL = 1e-6
READ = 'fs.read {"path": "/home/a/src/p/%s"}'
ITEMS = [('http.request {"method": "POST", "url": "https://x.io/a"}', [READ % ".env"]),
         ('email.send {"to": "a@b.com", "body": "hi"}', None),
         ('shell.exec {"cmd": "ls -la /tmp"}', [READ % "README.md", "git.push {}"])]


def test_familiar_values_scales_the_ngrams_by_the_share_of_their_mass_learned():
    """f = (sum of val^2 over n-grams whose weight is not 0) / (sum over all n-grams); the
    n-grams (entries [start, end)) times f ** power, the bias and the structured features
    after the n-grams as they are; a row without n-grams, and power 0, unchanged."""
    val = np.array([[1.0, 0.6, 0.8, 0.0, 0.5, 0.3],  # bias, 3 n-grams, 2 structured
                    [1.0, 0.7, 0.2, 0.0, 0.0, 0.0]])  # bias, 1 n-gram, 1 structured, padding
    w = np.array([[0.4, 0.0, -1.2, 3.0, 0.0, 0.0],  # learned: the second and third n-grams
                  [0.4, 0.0, 2.0, 0.0, 0.0, 0.0]])  # its one n-gram never learned
    end = np.array([4, 2])
    got = familiar_values(w, val, end, 2.0, 1)
    f0 = 0.8**2 / (0.6**2 + 0.8**2 + 0.0**2)  # the third n-gram's value 0: no mass
    want = val.copy()
    want[0, 1:4] *= f0**2
    want[1, 1:2] *= 0.0
    np.testing.assert_allclose(got, want, rtol=1e-15)
    assert familiar_values(w, val, end, 0.0, 1) is val
    np.testing.assert_array_equal(familiar_values(w, val, np.array([1, 1]), 2.0, 1), val)
    # with no bias the n-grams start at entry 0: the first entry is scaled too
    np.testing.assert_allclose(familiar_values(w, val, end, 1.0, 0)[1, :2],
                               val[1, :2] * (1.0 / (1.0 + 0.7**2)))  # entry 0 learned


def test_the_batch_says_where_the_ngrams_end_only_when_the_model_reads_them_scaled():
    """`source_batch` carries `NGRAM_END` with `wide_familiarity` > 0, the default (and not
    at 0, so a model without it sees the batch it always did); the entries before it are
    `wide_features`' own: the bias and the call's and the history's byte n-grams."""
    on = ModelConfig.tiny()
    assert on.wide_familiarity == ModelConfig.flint().wide_familiarity == 8.0  # the default
    off = dataclasses.replace(on, wide_familiarity=0.0)
    assert NGRAM_END not in source_batch(ITEMS, off)
    batch = source_batch(ITEMS, on)
    for k, (context, history) in enumerate(ITEMS):
        ids, segs = encode_source(context, history, on)
        idx, val = wide_features(ids, segs, on.wide_ngram, on.wide_buckets,
                                 on.wide_history_scale, on.wide_bias)
        end = int(batch[NGRAM_END][k])
        assert end == len(idx) < int((batch["wide_val"][k] != 0).sum())  # structured after
        np.testing.assert_array_equal(batch["wide_idx"][k, :end], idx)
        np.testing.assert_array_equal(batch["wide_val"][k, :end], val)
    with pytest.raises(ValueError, match="wide_familiarity"):
        ModelConfig(wide_familiarity=-1.0)
    # how the weights are read, not what they hold: a state stored before the field
    # existed, or at another value, loads (the fingerprint leaves the field out)
    # wide_bias 1: as before; the first-seen mark: ignored
    assert off.fingerprint() == fingerprint_before(off, "wide_familiarity", "wide_bias",
                                                   "wide_novel_destinations")
    assert on.fingerprint() == off.fingerprint()
    assert dataclasses.replace(on, wide_history_scale=0.5).fingerprint() != on.fingerprint()


def _half_learned_model(members: int, seed: int = 3, power: float = 2.0
                        ) -> tuple[Model, dict]:
    """A tiny float64 model reading its n-grams at familiarity `power` (2: the scale stays
    large enough for every gradient to be checked), with `members` members whose wide
    weights are O(1) but 0 at some of the buckets the batch's n-grams touch (each member
    its own), so f is well inside (0, 1); the batch of `ITEMS` with reasons and weights."""
    cfg = dataclasses.replace(ModelConfig.tiny(), wide_familiarity=power, wide_members=members,
                              wide_novel_destinations=0.0)  # the mark: test_novel_destination
    model = Model.init(cfg, seed=seed, dtype="float64")
    rng = np.random.default_rng(seed)
    model.flat[...] = rng.normal(0.0, 0.3, model.flat.shape)
    batch = build_batch([{"context": c, "history": h, "reason": "r", "label": k % 2,
                          "weight": 1.0 + k} for k, (c, h) in enumerate(ITEMS)], cfg)
    w = model.params["wide.w"]
    for m in range(members):
        for row, end in zip(batch["wide_idx"], batch[NGRAM_END], strict=True):
            ngrams = row[1:end]
            w[m, ngrams[rng.random(len(ngrams)) < 0.2]] = 0.0
    return model, batch


def _twin(model: Model, cfg: ModelConfig, dtype: str = "float64") -> Model:
    """A model of `cfg` (the same layout) holding `model`'s weights, in `dtype`."""
    twin = Model.init(cfg, dtype=dtype)
    twin.flat[...] = model.flat
    return twin


def _familiarity(model: Model, batch: dict) -> np.ndarray:
    """f per (member, row), from its definition."""
    out = []
    for o_w, _, _ in member_offsets(model.cfg):
        w = model.params["wide.w"].reshape(-1)[shifted(batch["wide_idx"], o_w)]
        pos = np.arange(w.shape[1])[None, :]
        ngram = (pos >= 1) & (pos < batch[NGRAM_END][:, None])
        mass = np.where(ngram, batch["wide_val"] ** 2, 0.0)
        out.append(np.where(w != 0, mass, 0.0).sum(axis=1) / mass.sum(axis=1))
    return np.array(out)


@pytest.mark.parametrize("members", [1, 2])
def test_the_scaled_wide_logits_gradient_matches_central_differences(members: int):
    """Through the model's forward and backward with the n-grams read scaled: the wide
    weights' gradient at every learned bucket the batch touches, against central
    differences. f is constant there (a weight that is not 0 stays not 0 under a 1e-4
    step), so the gradient of an n-gram's weight is f ** power times its value: exact. A
    weight at 0 is where f jumps (it counts once it is stepped): no derivative there, not
    checked."""
    model, batch = _half_learned_model(members)
    f = _familiarity(model, batch)
    assert ((f > 0.3) & (f < 0.9)).all()  # scaled for real, by each member its own
    model.loss_and_grads(batch)
    w = model.params["wide.w"]
    idx = sorted({(m, int(i)) for m in range(members) for i in batch["wide_idx"][:, 1:].ravel()
                  if w[m, i] != 0})
    num = numeric_grad_entries(lambda: model.loss(batch)[0], w, idx)
    ana = np.array([model.grads["wide.w"][i] for i in idx])
    assert np.abs(ana).min() > 0 and rel_error(ana, num) < TOL
    # and it is not the gradient of the unscaled logit
    plain = _twin(model, dataclasses.replace(model.cfg, wide_familiarity=0.0))
    plain.loss_and_grads({k: v for k, v in batch.items() if k != NGRAM_END})
    assert np.abs(np.array([plain.grads["wide.w"][i] for i in idx]) - ana).max() > 1e-3


@pytest.mark.parametrize("members", [1, 3])
def test_the_model_the_plan_and_the_learner_decide_by_the_same_scaled_logit(members: int):
    """Serving's two forwards (the model's, the CPU inference plan's) and the wide learner's
    `logit` told where the n-grams end give one wide logit, the n-grams scaled: the
    harness scores as the daemon serves. Learning reads them unscaled: the learner's
    `logit` without the end is the unscaled model's."""
    model, batch = _half_learned_model(members, seed=5)
    sources = {k: v for k, v in batch.items() if not k.startswith(("tgt", "label", "weight"))}
    served = model.wide_logit(sources)
    cfg0 = dataclasses.replace(model.cfg, wide_familiarity=0.0)
    unscaled = _twin(model, cfg0).wide_logit(
        {k: v for k, v in sources.items() if k != NGRAM_END})
    assert np.abs(served - unscaled).min() > 1e-3
    learner = WideAdaGrad.for_model(model, np.zeros(model.num_params))
    assert isinstance(learner, WideBag) == (members > 1)
    for k in range(len(ITEMS)):
        idx, val = batch["wide_idx"][k], batch["wide_val"][k]
        pair = tuple(batch[key][k] for key in PAIR_KEYS)
        end = int(batch[NGRAM_END][k])
        assert learner.logit(idx, val, 0.0, pair, end) == pytest.approx(served[k], rel=1e-12)
        assert learner.logit(idx, val, 0.0, pair) == pytest.approx(unscaled[k], rel=1e-12)
    f32 = _twin(model, model.cfg, "float32")
    want = f32.predict_z(sources)
    np.testing.assert_allclose(InferencePlan(f32).logits(sources), want, rtol=1e-4, atol=1e-5)
    z0 = _twin(model, cfg0, "float32").predict_z({k: v for k, v in sources.items()
                                                 if k != NGRAM_END})
    np.testing.assert_allclose(want - z0, served - unscaled, rtol=1e-3, atol=1e-4)


def test_a_call_of_ngrams_mostly_never_learned_is_judged_by_its_other_features():
    """Row 0 has learned only two of its n-grams, with large weights: unscaled they speak
    for the call; scaled by f ** 8 (f, their share of its n-gram mass, small) the wide logit
    is the one without n-grams, plus f ** 8 of what they said (the pair term is added,
    so this is exact). A call whose every n-gram is learned (f = 1) reads as unscaled."""
    model, batch = _half_learned_model(1, seed=7, power=8.0)
    sources = {k: v for k, v in batch.items() if not k.startswith(("tgt", "label", "weight"))}
    w, end = model.params["wide.w"][0], sources[NGRAM_END]
    ngrams = sources["wide_idx"][0, 1:end[0]]
    w[ngrams] = 0.0
    w[ngrams[:2]] = (9.0, 7.0)  # the two it learned, sure of "allow"
    f = _familiarity(model, sources)[0, 0]
    assert 0.0 < f < 0.3
    plain = dataclasses.replace(model.cfg, wide_familiarity=0.0)
    unscaled = {k: v.copy() for k, v in sources.items() if k != NGRAM_END}
    z, z_plain = model.wide_logit(sources), _twin(model, plain).wide_logit(unscaled)
    unscaled["wide_val"][0, 1:end[0]] = 0.0  # row 0 without its n-grams
    z_without = _twin(model, plain).wide_logit(unscaled)[0]
    assert z_plain[0] - z_without > 0.5  # what the two said, unscaled
    assert z[0] == pytest.approx(z_without + f**8 * (z_plain[0] - z_without), rel=1e-12)
    learned = sources["wide_idx"][1, 1:end[1]]  # row 1: every n-gram learned
    w[learned] = np.where(w[learned] == 0, 0.5, w[learned])
    unscaled["wide_val"][0] = sources["wide_val"][0]
    z, z_plain = model.wide_logit(sources), _twin(model, plain).wide_logit(unscaled)
    assert z[1] == pytest.approx(z_plain[1], rel=1e-12) and z[2] != pytest.approx(z_plain[2])


def test_serving_reads_the_ngrams_unscaled_while_the_trainer_adapts_to_a_drift(tmp_path):
    """For the first `train.drift_wide_unscaled_examples` examples the trainer's wide
    learner learns after a drift alarm (its contradiction window open), the calibration it
    publishes turns the scaling off: serving's predictions and explanations then read the
    n-grams as a model without the scaling does, and a second server loading the
    published version reads them so too. 0 (hot) never; scaled again after them, though
    the window is still open."""
    model, _ = _half_learned_model(1, seed=5, power=8.0)
    flat = model.flat.astype(np.float32)
    store = Store(str(tmp_path))
    trainer, serving = build_trainer(store, model.cfg, TrainConfig(), seed=0)
    serving.swap(flat, 1, 0)
    scaled = serving.score_many(ITEMS)[0]
    plain = Serving(dataclasses.replace(model.cfg, wide_familiarity=0.0), flat, 1, 0)
    want = plain.score_many(ITEMS)[0]
    assert np.abs(scaled - want).max() > 1e-2  # the scaling moves these logits
    assert trainer.served_calibration().familiar
    trainer.settings = dataclasses.replace(TrainConfig(), drift_wide_unscaled_examples=2)
    learner = trainer.wide_path.learner
    learner.relax_contradicted(0.1, 3, 0.0)  # as `on_drift` opens it
    cal = trainer.served_calibration()
    assert not cal.familiar and Calibration(*cal.as_list()) == cal
    assert Calibration(*cal.as_list()[:4]).familiar  # stored before the field: scaled
    serving.calibration = cal
    plain.calibration = dataclasses.replace(cal, familiar=True)  # the same Platt map
    np.testing.assert_allclose(serving.score_many(ITEMS)[0], want, rtol=1e-5, atol=1e-6)
    context, history = ITEMS[0]
    assert serving.explain(context, history)["p_allow"] == pytest.approx(
        plain.explain(context, history)["p_allow"], rel=1e-5)
    trainer._publish(flat, flat, 0, False)  # the version and its calibration to LMDB
    other = Serving(model.cfg, flat, 0, 0)
    assert other.load_published(store) is not None and not other.calibration.familiar
    np.testing.assert_allclose(other.score_many(ITEMS)[0], want, rtol=1e-5, atol=1e-6)
    trainer.settings = dataclasses.replace(trainer.settings, drift_wide_unscaled_examples=0)
    assert trainer.served_calibration().familiar
    trainer.settings = dataclasses.replace(trainer.settings, drift_wide_unscaled_examples=2)
    row = source_batch(ITEMS[:1], model.cfg)
    for left in (2, 1):  # the window's first two examples, learned: scaled after them
        assert not trainer.served_calibration().familiar
        learner.learn(row["wide_idx"][0], row["wide_val"][0], 0.0, 0.0, 1.0,
                      tuple(row[key][0] for key in PAIR_KEYS))
        assert learner.contra_left == left
    assert trainer.served_calibration().familiar  # the window still open, its first 2 done


@pytest.mark.parametrize("familiar", [True, False])
def test_score_parts_is_what_serving_answers_with_the_wide_share_computed_once(familiar):
    """The trainer's progressive validation (and the benchmark's probes) score through
    `Serving.score_parts`: the same logits and calibrated p as a prediction, for the batch
    as the calibration reads it, and the transformer's part of each logit beside them."""
    model, _ = _half_learned_model(2, seed=5, power=8.0)
    serving = Serving(model.cfg, model.flat.astype(np.float32), 1, 0)
    serving.calibration = Calibration(1.3, -0.2, 0.4, True, familiar)  # d != 0: uses z_deep
    batch = source_batch(ITEMS, model.cfg)
    got = serving.score_parts(batch)
    z, p, snap = serving.score_sources(batch)
    np.testing.assert_array_equal(got.z, z)
    np.testing.assert_array_equal(got.p, p)
    assert got.snapshot is snap and (NGRAM_END in got.sources) == familiar
    np.testing.assert_array_equal(got.z_deep, z - snap.model.wide_logit(got.sources))
    assert np.abs(got.z - got.z_deep).max() > 1e-2  # the wide share is not nothing here
    np.testing.assert_array_equal(got.p, serving.calibration(z, got.z_deep))
