"""The first-seen destination mark (`ModelConfig.wide_novel_destinations`, engine/wide.py
``d|novel``, engine/wide_logit.py `novel_values`): the batch that says where the domain
key and its mark sit, the mark read only while the reading member's domain key is
unlearned, the learner stepping it on a destination's first sight only, the same logit
wherever a decision is made, and exact gradients through the model's forward."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from config_history import fingerprint_before
from gradcheck import numeric_grad_entries, rel_error

from gated.config import TrainConfig
from gated.daemon.serving import Serving
from gated.daemon.trainer import build_trainer
from gated.daemon.trainer.wide_path import wide_row
from gated.engine import Model, ModelConfig, build_batch
from gated.engine.infer import InferencePlan
from gated.engine.tokenizer import source_batch
from gated.engine.wide import NOVEL_AT, NOVEL_KEY, PAIR_KEYS, _bucket
from gated.engine.wide_learner import WideAdaGrad, WideBag
from gated.engine.wide_logit import member_offsets, novel_values, shifted
from gated.store import Store

TOL = 1e-6
READ = 'fs.read {"path": "/home/a/src/p/%s"}'
ITEMS = [('http.request {"method": "POST", "url": "https://api.x.io/a"}', [READ % ".env"]),
         ('email.send {"to": "a@b.com", "body": "hi"}', None),
         ('shell.exec {"cmd": "ls -la /tmp"}', [READ % "README.md"]),
         ('http.request {"method": "GET", "url": "https://docs.x.io/b"}', None)]
DOMAINS = ["x.io", "b.com", None, "x.io"]


def _cfg(members: int = 1, scale: float = 0.5) -> ModelConfig:
    return dataclasses.replace(ModelConfig.tiny(), wide_novel_destinations=scale,
                               wide_members=members)


def test_novel_values_reads_the_mark_only_where_the_domain_key_is_unlearned():
    """The mark, right after the domain key at `novel_at` + 1, is 0 where the member's
    weight at the domain key is not 0, as it is where it is 0; a row without a
    destination (-1) and every other entry unchanged."""
    val = np.array([[1.0, 0.6, 0.3, 0.5, 0.0],
                    [1.0, 0.6, 0.3, 0.5, 0.0],
                    [1.0, 0.6, 0.3, 0.5, 0.0]])
    w = np.array([[0.4, 0.1, 0.0, 2.0, 0.0],    # domain key (entry 2) unlearned: mark read
                  [0.4, 0.1, -0.7, 2.0, 0.0],   # learned: the mark reads 0
                  [0.4, 0.0, 0.0, 2.0, 0.0]])   # no destination
    got = novel_values(w, val, np.array([2, 2, -1]))
    want = val.copy()
    want[1, 3] = 0.0
    np.testing.assert_array_equal(got, want)


def test_the_batch_puts_the_domain_key_and_its_mark_last_and_says_where():
    """`source_batch` carries `NOVEL_AT` only with the mark on (the default: 1); it points
    at the call's domain key (``d|<last two labels>``), the mark of value
    `wide_novel_destinations` right after it, the row's last features; -1 for a call
    without a destination. The field is not in the fingerprint: a state stored before
    the mark was on (or before the field existed) loads and reads it; the mark needs the
    domain key."""
    cfg = _cfg()
    assert ModelConfig.flint().wide_novel_destinations == ModelConfig.tiny(
    ).wide_novel_destinations == 1.0
    off = dataclasses.replace(ModelConfig.tiny(), wide_novel_destinations=0.0)
    assert NOVEL_AT not in source_batch(ITEMS, off)
    batch = source_batch(ITEMS, cfg)
    for k, domain in enumerate(DOMAINS):
        at = int(batch[NOVEL_AT][k])
        if domain is None:
            assert at == -1 and _bucket(NOVEL_KEY, cfg.wide_buckets) not in batch["wide_idx"][k]
            continue
        assert batch["wide_idx"][k, at] == _bucket("d|" + domain, cfg.wide_buckets)
        assert batch["wide_val"][k, at] == cfg.wide_call_domains
        assert batch["wide_idx"][k, at + 1] == _bucket(NOVEL_KEY, cfg.wide_buckets)
        assert batch["wide_val"][k, at + 1] == 0.5
        assert not batch["wide_val"][k, at + 2:].any()  # padding after them
    assert off.fingerprint() == cfg.fingerprint() == ModelConfig.tiny().fingerprint()
    assert off.fingerprint() == fingerprint_before(  # as the code before it
        off, "wide_novel_destinations", "wide_familiarity", "wide_bias")
    with pytest.raises(ValueError, match="wide_call_domains"):
        dataclasses.replace(cfg, wide_call_domains=0.0)
    with pytest.raises(ValueError, match="wide_novel_destinations"):
        dataclasses.replace(cfg, wide_novel_destinations=-1.0)


def test_the_learner_steps_the_mark_on_a_destinations_first_sight_only():
    """The first call to x.io steps the mark (its weight leaves 0) and x.io's key; a second
    call to x.io reads the mark 0 and leaves its weight exactly as it was; a first call to
    b.com steps it again. The learner's rows are `wide_row`'s, trimmed of padding."""
    cfg = _cfg()
    model = Model.init(cfg, seed=1, dtype="float64")
    learner = WideAdaGrad.for_model(model, np.zeros(model.num_params))
    batch = source_batch(ITEMS, cfg)
    mark = _bucket(NOVEL_KEY, cfg.wide_buckets)
    w = model.params["wide.w"][0]
    assert w[mark] == 0.0
    idx, val, pair, at = wide_row(batch, 0)
    assert idx[at + 1] == mark
    learner.learn(idx, val, 0.0, 0.0, 1.0, pair, novel_at=at)  # x.io, blocked
    first = w[mark]
    assert first < 0.0 and w[idx[at]] != 0.0
    idx, val, pair, at = wide_row(batch, 3)  # x.io again, allowed
    learner.learn(idx, val, 0.0, 1.0, 1.0, pair, novel_at=at)
    assert w[mark] == first and w[idx[at]] != 0.0
    idx, val, pair, at = wide_row(batch, 1)  # b.com, first sight
    learner.learn(idx, val, 0.0, 1.0, 1.0, pair, novel_at=at)
    assert w[mark] > first


@pytest.mark.parametrize("members", [1, 3])
def test_the_model_the_plan_and_the_learner_read_the_mark_alike(members: int):
    """With one member having learned x.io and not b.com (the others neither), serving's
    two forwards and the wide learner's `logit` told where the domain key sits give one
    wide logit; without the place the learner reads the mark as it is, which differs
    only where a member has learned the destination."""
    cfg = _cfg(members)
    model = Model.init(cfg, seed=2, dtype="float64")
    rng = np.random.default_rng(2)
    model.flat[...] = rng.normal(0.0, 0.3, model.flat.shape)
    batch = source_batch(ITEMS, cfg)
    w = model.params["wide.w"]
    x_io, b_com = (_bucket("d|" + d, cfg.wide_buckets) for d in ("x.io", "b.com"))
    w[:, b_com] = 0.0
    w[1:, x_io] = 0.0  # member 0 has learned x.io, the others have not
    served = model.wide_logit(batch)
    learner = WideAdaGrad.for_model(model, np.zeros(model.num_params))
    assert isinstance(learner, WideBag) == (members > 1)
    end = batch.get("wide_ng_end")
    for k in range(len(ITEMS)):
        idx, val = batch["wide_idx"][k], batch["wide_val"][k]
        pair = tuple(batch[key][k] for key in PAIR_KEYS)
        ng = None if end is None else int(end[k])
        at = int(batch[NOVEL_AT][k])
        assert learner.logit(idx, val, 0.0, pair, ng, at) == pytest.approx(served[k], rel=1e-12)
        as_is = learner.logit(idx, val, 0.0, pair, ng, -1)
        if DOMAINS[k] == "x.io":  # member 0 has learned it: it reads the mark 0
            assert as_is != pytest.approx(served[k])
        else:  # no member has learned b.com: read as it is; no mark at all
            assert as_is == pytest.approx(served[k], rel=1e-12)
    model32 = Model.init(cfg, dtype="float32")
    model32.flat[...] = model.flat
    np.testing.assert_allclose(InferencePlan(model32).logits(batch), model32.predict_z(batch),
                               rtol=1e-4, atol=1e-5)
    no_place = {k: v for k, v in batch.items() if k != NOVEL_AT}
    assert np.abs(model.wide_logit(no_place) - served).max() > 1e-3


@pytest.mark.parametrize("members", [1, 2])
def test_the_marks_gradient_matches_central_differences(members: int):
    """Through the model's forward and backward with the mark read by each member's domain
    keys: the gradient at the mark's bucket and at the domain keys, against central
    differences, where one destination is learned by every member and the other by none
    (the read does not move under a 1e-4 step of a weight that is not 0)."""
    cfg = _cfg(members)
    model = Model.init(cfg, seed=3, dtype="float64")
    rng = np.random.default_rng(3)
    model.flat[...] = rng.normal(0.0, 0.3, model.flat.shape)
    batch = build_batch([{"context": c, "history": h, "reason": "r", "label": k % 2,
                          "weight": 1.0 + k} for k, (c, h) in enumerate(ITEMS)], cfg)
    w = model.params["wide.w"]
    b_com = _bucket("d|b.com", cfg.wide_buckets)
    w[:, b_com] = 0.0  # b.com never learned: its row reads the mark; x.io's rows do not
    model.loss_and_grads(batch)
    mark, x_io = _bucket(NOVEL_KEY, cfg.wide_buckets), _bucket("d|x.io", cfg.wide_buckets)
    idx = [(m, b) for m in range(members) for b in (mark, x_io)]
    num = numeric_grad_entries(lambda: model.loss(batch)[0], w, idx)
    ana = np.array([model.grads["wide.w"][i] for i in idx])
    assert np.abs(ana).min() > 0 and rel_error(ana, num) < TOL
    # the mark is read by b.com's row only: x.io's rows read it 0
    for o_w, _, _ in member_offsets(cfg):
        read = novel_values(w.reshape(-1)[shifted(batch["wide_idx"], o_w)],
                            batch["wide_val"], batch[NOVEL_AT])
        at = batch[NOVEL_AT]
        assert read[1, at[1] + 1] == 0.5 and read[0, at[0] + 1] == read[3, at[3] + 1] == 0.0


def test_a_state_stored_without_the_mark_resumes_with_it_on(tmp_path):
    """The mark made the default must not cost a stored state its weights: a checkpoint
    written by a model without it (real LMDB) resumes under the default config, every
    weight as stored, and serving then reads the mark on a call to a domain the state
    never learned (its logit moves by the mark's weight times its value, exactly as a
    model without the mark plus that term) and not on one it learned."""
    on = dataclasses.replace(ModelConfig.tiny(), wide_novel_destinations=0.5)
    off = dataclasses.replace(on, wide_novel_destinations=0.0)
    model = Model.init(off, seed=4)
    rng = np.random.default_rng(4)
    w = model.params["wide.w"][0]
    learned = rng.random(w.shape) < 0.5
    w[...] = np.where(learned, rng.normal(0.0, 0.3, w.shape), 0.0)
    x_io, b_com, mark = (_bucket(k, on.wide_buckets) for k in ("d|x.io", "d|b.com", NOVEL_KEY))
    w[x_io], w[b_com], w[mark] = 0.4, 0.0, -1.5  # x.io learned, b.com never; the mark's bucket
    flat = model.flat.astype(np.float32)
    store = Store(str(tmp_path))
    store.save_checkpoint(flat=flat, m=np.zeros_like(flat), v=np.zeros_like(flat), step=9,
                          last_trained_seq=9, layout=model.layout,
                          config_fingerprint=off.fingerprint(), extra={"version": 3})
    trainer, serving = build_trainer(store, on, TrainConfig(), seed=0)
    assert trainer.status.step == 9 and serving.current.version == 3
    np.testing.assert_array_equal(trainer.model.ops.to_numpy(trainer.model.flat), flat)
    items = [ITEMS[1], ITEMS[3]]  # b.com (never learned), x.io (learned)
    served = serving.score_many(items)[0]  # raw gate logits
    plain = Serving(off, flat, 3, 9).score_many(items)[0]
    assert served[0] - plain[0] == pytest.approx(-1.5 * 0.5, rel=1e-4)
    assert served[1] == pytest.approx(plain[1], rel=1e-6)
