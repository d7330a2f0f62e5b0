"""AdamW against its formula, clipping, schedule, and the training step verb."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gated.engine import AdamW, Model, ModelConfig, Schedule, build_batch, ops_numpy, train_step


def _reference_adamw(p, grads, decay, lr, b1, b2, eps, wd, clip):
    """Scalar-by-scalar AdamW in PyTorch's order, written straight from DESIGN.md."""
    p = [float(x) for x in p]
    m = [0.0] * len(p)
    v = [0.0] * len(p)
    norms = []
    for t, g in enumerate(grads, start=1):
        norm = math.sqrt(sum(float(x) ** 2 for x in g))
        norms.append(norm)
        scale = clip / (norm + 1e-6) if clip and norm > clip else 1.0
        for j in range(len(p)):
            gj = float(g[j]) * scale
            if decay[j]:
                p[j] -= lr * wd * p[j]
            m[j] = b1 * m[j] + (1 - b1) * gj
            v[j] = b2 * v[j] + (1 - b2) * gj * gj
            p[j] -= lr * (m[j] / (1 - b1**t)) / (math.sqrt(v[j] / (1 - b2**t)) + eps)
    return np.array(p), np.array(m), np.array(v), norms


@pytest.mark.parametrize("block", [None, 16, 7])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_adamw_matches_formula_over_several_steps(clip, block, monkeypatch):
    """`block`: the update and the norm run in blocks of that many elements (the default
    is larger than this buffer), so their seams are crossed: the result must not move."""
    if block is not None:
        monkeypatch.setattr(ops_numpy, "FLAT_BLOCK", block)
    rng = np.random.default_rng(0)
    n = 40
    p0 = rng.normal(size=n)
    decay = (np.arange(n) % 3 == 0).astype(float)
    grads = [rng.normal(0, 2, n) for _ in range(5)]
    opt = AdamW(n, decay, lr=0.01, betas=(0.8, 0.95), eps=1e-8, weight_decay=0.1,
                clip_norm=clip, dtype="float64")
    p = p0.copy()
    reported = []
    for g in grads:
        reported.append(opt.step(p, g.copy())["grad_norm"])
    ref_p, ref_m, ref_v, ref_norms = _reference_adamw(p0, grads, decay, 0.01, 0.8, 0.95,
                                                      1e-8, 0.1, clip)
    np.testing.assert_allclose(p, ref_p, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(opt.m, ref_m, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(opt.v, ref_v, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(reported, ref_norms, rtol=1e-12)  # the PRE-clip norm
    assert opt.t == 5


def test_decay_mask_covers_exactly_the_2d_matrices():
    model = Model.init(ModelConfig.tiny(), seed=0)
    mask = model.decay_mask()
    for name, arr in model.params.items():
        off = int((arr.__array_interface__["data"][0] - model.flat.__array_interface__["data"][0])
                  // model.flat.itemsize)
        seg = mask[off : off + arr.size]
        assert np.all(seg == (1.0 if arr.ndim == 2 else 0.0)), name


def test_clipping_bounds_the_applied_gradient():
    n = 10
    opt = AdamW(n, np.zeros(n), lr=1.0, clip_norm=1.0, weight_decay=0.0, dtype="float64")
    g = np.full(n, 3.0)
    info = opt.step(np.zeros(n), g)
    assert info["grad_norm"] == pytest.approx(math.sqrt(90))
    # First step m = (1-b1) * clipped g: its norm is (1-b1) * 1.0, not (1-b1) * sqrt(90).
    assert np.linalg.norm(opt.m) == pytest.approx(0.1 * 1.0 * math.sqrt(90) / (math.sqrt(90)
                                                                                + 1e-6))
    opt2 = AdamW(n, np.zeros(n), lr=1.0, clip_norm=100.0, dtype="float64")
    opt2.step(np.zeros(n), g)
    assert np.linalg.norm(opt2.m) == pytest.approx(0.1 * math.sqrt(90))


@pytest.mark.parametrize("bad", ["grad", "loss"])
def test_a_non_finite_step_changes_nothing_and_does_not_count(bad):
    """The finite check lives in the update itself (on the GPU it is decided there, with
    no host read first): a NaN gradient or an infinite loss leaves weights, moments and
    the step count as they were, and the next step is the one that counts."""
    n = 6
    opt = AdamW(n, np.ones(n), lr=0.1, dtype="float64")
    p = np.linspace(-1, 1, n)
    opt.step(p, np.full(n, 0.5), loss=1.0)
    before = (p.copy(), opt.m.copy(), opt.v.copy(), opt.t)
    g, loss = np.full(n, 0.5), 1.0
    if bad == "grad":
        g[3] = np.nan
    else:
        loss = np.inf
    info = opt.step(p, g, loss=loss)
    assert info["finite"] == 0.0 and math.isnan(info["grad_norm"])
    assert info["lr"] == pytest.approx(0.1)
    for a, b in zip((p, opt.m, opt.v), before[:3], strict=True):
        np.testing.assert_array_equal(a, b)
    assert opt.t == before[3] == 1
    assert opt.step(p, np.full(n, 0.5), loss=1.0)["finite"] == 1.0 and opt.t == 2


def test_schedule_constant_warmup_cosine():
    assert [Schedule(0.1).at(s) for s in (1, 100, 10**6)] == [0.1, 0.1, 0.1]
    s = Schedule(1.0, warmup_steps=10, cosine_steps=100, min_lr=0.1)
    assert s.at(1) == pytest.approx(0.1) and s.at(5) == pytest.approx(0.5)
    assert s.at(10) == pytest.approx(1.0)
    assert s.at(60) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))
    assert s.at(110) == pytest.approx(0.1) and s.at(5000) == pytest.approx(0.1)
    opt = AdamW(3, np.zeros(3), lr=1.0, warmup_steps=4, dtype="float64")
    lrs = [opt.step(np.zeros(3), np.ones(3))["lr"] for _ in range(5)]
    assert lrs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])


def test_train_step_is_deterministic_and_reduces_loss():
    cfg = ModelConfig.tiny()
    batch = build_batch([{"context": "rm -rf ~", "history": None, "reason": "delete home",
                          "label": 0, "weight": 1.0},
                         {"context": "ls src", "history": ["pwd"], "reason": None, "label": 1,
                          "weight": 1.0}], cfg)
    runs = []
    for _ in range(2):
        model = Model.init(cfg, seed=3)
        opt = AdamW.for_model(model, lr=3e-3)
        losses = [train_step(model, opt, batch)["loss"] for _ in range(20)]
        runs.append((losses, model.flat.copy()))
    assert runs[0][0] == runs[1][0] and np.array_equal(runs[0][1], runs[1][1])
    assert runs[0][0][-1] < 0.5 * runs[0][0][0]


def test_non_finite_step_leaves_weights_untouched():
    cfg = ModelConfig.tiny()
    model = Model.init(cfg, seed=0)
    opt = AdamW.for_model(model)
    before = model.flat.copy()
    batch = build_batch([{"context": "x", "history": None, "reason": None, "label": 1,
                          "weight": float("nan")}], cfg)
    info = train_step(model, opt, batch)
    assert info["finite"] == 0.0 and opt.t == 0
    assert np.array_equal(model.flat, before) and not opt.m.any()
