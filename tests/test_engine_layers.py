"""Each layer's hand-written backward against central differences, in float64.

Every check uses f = sum(R * layer(x)) for a fixed random R, so the analytic gradient is
the layer's backward applied to R.
"""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import numeric_grad_entries, rel_error, sample_indices

from gated.engine import layers as L
from gated.engine import ops_numpy
from gated.engine.ops_numpy import NumpyOps

OPS = NumpyOps()
TOL = 1e-6


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def _params(rng, names_shapes):
    P = {n: rng.normal(0, 0.5, s) for n, s in names_shapes}
    G = {n: np.zeros(s) for n, s in names_shapes}
    return P, G


def _check(f, analytic, arr, rng, k=12):
    idx = sample_indices(arr.shape, k, rng)
    num = numeric_grad_entries(f, arr, idx)
    ana = np.array([analytic[i] for i in idx])
    assert rel_error(ana, num) < TOL


def _attn_params(rng, name, d):
    shapes = []
    for p in "qkvo":
        shapes += [(f"{name}.w{p}", (d, d)), (f"{name}.b{p}", (d,))]
    return _params(rng, shapes)


def test_layernorm_backward(rng):
    d = 7
    x = rng.normal(0, 2, (3, 4, d))
    P, G = _params(rng, [("ln.g", (d,)), ("ln.b", (d,))])
    R = rng.normal(size=x.shape)

    def f():
        return float((L.ln_fwd(OPS, P, "ln", x, 1e-5)[0] * R).sum())

    _, cache = L.ln_fwd(OPS, P, "ln", x, 1e-5)
    dx = L.ln_bwd(OPS, P, G, "ln", R, cache)
    _check(f, dx, x, rng)
    _check(f, G["ln.g"], P["ln.g"], rng)
    _check(f, G["ln.b"], P["ln.b"], rng)


def test_linear_backward(rng):
    x = rng.normal(size=(2, 3, 5))
    w, b = rng.normal(size=(4, 5)), rng.normal(size=4)
    dw, db = np.zeros_like(w), np.zeros_like(b)
    R = rng.normal(size=(2, 3, 4))

    def f():
        return float((L.linear_fwd(x, w, b) * R).sum())

    dx = L.linear_bwd(OPS, R, x, w, dw, db)
    for ana, arr in ((dx, x), (dw, w), (db, b)):
        _check(f, ana, arr, rng)


def test_ffn_gelu_backward(rng):
    d, ff = 6, 10
    x = rng.normal(0, 1.5, (2, 3, d))
    P, G = _params(rng, [("f.w1", (ff, d)), ("f.b1", (ff,)), ("f.w2", (d, ff)), ("f.b2", (d,))])
    R = rng.normal(size=x.shape)

    def f():
        return float((L.ffn_fwd(OPS, P, "f", x)[0] * R).sum())

    _, cache = L.ffn_fwd(OPS, P, "f", x)
    dx = L.ffn_bwd(OPS, P, G, "f", R, cache)
    _check(f, dx, x, rng)
    for n in P:
        _check(f, G[n], P[n], rng)


def test_gelu_is_tanh_approximation():
    x = np.linspace(-5, 5, 101)
    y, _ = OPS.bias_gelu_fwd(x.copy(), 0.0)  # the input buffer is consumed
    expect = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    # rtol 1e-14: the kernel evaluates a (1 + k a^2), not a + k a^3 (rounding order only).
    np.testing.assert_allclose(y, expect, rtol=1e-14, atol=0)


@pytest.mark.parametrize("kind", ["masked_self", "causal_self", "cross"])
def test_attention_backward(rng, kind):
    d, h, b, tq = 8, 2, 2, 5
    tk = 4 if kind == "cross" else tq
    P, G = _attn_params(rng, "a", d)
    xq = rng.normal(size=(b, tq, d))
    xkv = rng.normal(size=(b, tk, d)) if kind == "cross" else xq
    if kind == "causal_self":
        keep = np.tril(np.ones((tq, tq), dtype=bool))[None, None]
    else:
        key_ok = np.ones((b, tk), dtype=bool)
        key_ok[1, -2:] = False  # PAD keys of the second example
        keep = key_ok[:, None, None, :]
    R = rng.normal(size=(b, tq, d))

    def f():
        kv = xq if kind != "cross" else xkv
        return float((L.attn_fwd(OPS, P, "a", xq, kv, keep, h)[0] * R).sum())

    _, cache = L.attn_fwd(OPS, P, "a", xq, xkv, keep, h)
    dxq, dxkv = L.attn_bwd(OPS, P, G, "a", R, cache, h)
    if kind == "cross":
        _check(f, dxq, xq, rng)
        _check(f, dxkv, xkv, rng)
        # Masked keys get exactly zero gradient: they are -inf before the softmax.
        assert np.all(dxkv[1, -2:] == 0.0)
    else:
        _check(f, dxq + dxkv, xq, rng)
    for n in P:
        _check(f, G[n], P[n], rng)


def test_masked_softmax_gives_zero_to_masked_keys(rng):
    s = rng.normal(size=(1, 1, 3, 4))
    keep = np.array([True, True, False, True])[None, None, None, :]
    p = OPS.masked_softmax(s, keep, 1.0)
    assert np.all(p[..., 2] == 0.0)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-15)


def test_cross_entropy_backward(rng):
    n, v = 6, 9
    logits = rng.normal(0, 2, (n, v))
    targets = rng.integers(0, v, n)
    mask = np.array([1, 1, 0, 1, 0, 1], dtype=float)

    def f():
        return OPS.cross_entropy(logits, targets, mask, 1.0)[0]

    loss, dlogits, count = OPS.cross_entropy(logits, targets, mask, 1.0)
    assert count == 4
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    assert loss == pytest.approx(-(lp[np.arange(n), targets] * mask).sum() / 4, rel=1e-14)
    _check(f, dlogits, logits, rng, k=20)
    assert np.all(dlogits[mask == 0] == 0.0)


def test_cross_entropy_without_targets_is_zero(rng):
    loss, dlogits, count = OPS.cross_entropy(rng.normal(size=(3, 5)), np.zeros(3, int),
                                             np.zeros(3), 1.0)
    assert loss == 0.0 and count == 0 and np.all(dlogits == 0)


def test_bce_stable_form_and_gradient(rng):
    z = np.array([-800.0, -3.0, 0.0, 2.5, 800.0])
    y = np.array([1.0, 0.0, 1.0, 0.0, 1.0])
    w = np.array([1.0, 2.0, 4.0, 6.0, 8.0])
    loss, dz = OPS.bce_with_logits(z, y, w, 1.0)
    assert np.isfinite(loss) and np.all(np.isfinite(dz))
    # Moderate logits: compare with the textbook formula and the DESIGN gradient.
    zm = rng.normal(0, 2, 7)
    ym = rng.integers(0, 2, 7).astype(float)
    wm = rng.uniform(0.5, 8, 7)
    loss_m, dz_m = OPS.bce_with_logits(zm, ym, wm, 1.0)
    s = 1 / (1 + np.exp(-zm))
    naive = np.mean(wm * -(ym * np.log(s) + (1 - ym) * np.log(1 - s)))
    assert loss_m == pytest.approx(naive, rel=1e-12)
    np.testing.assert_allclose(dz_m, wm * (s - ym) / 7, rtol=1e-12)
    _check(lambda: OPS.bce_with_logits(zm, ym, wm, 1.0)[0], dz_m, zm, rng, k=7)


def test_mean_pool_and_embedding_backward(rng):
    x = rng.normal(size=(2, 4, 3))
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=float)
    R = rng.normal(size=(2, 3))

    def f():
        return float((OPS.mean_pool(x, mask)[0] * R).sum())

    pooled, denom = OPS.mean_pool(x, mask)
    np.testing.assert_allclose(pooled[0], x[0, :2].mean(0), rtol=1e-15)
    _check(f, OPS.mean_pool_bwd(R, mask, denom), x, rng, k=24)

    emb = rng.normal(size=(5, 3))
    tok = np.array([[1, 3, 1], [4, 1, 0]])
    Rx = rng.normal(size=(2, 3, 3))
    d_emb = np.zeros_like(emb)
    OPS.embedding_bwd(d_emb, tok, Rx)
    _check(lambda: float((emb[tok] * Rx).sum()), d_emb, emb, rng, k=15)
    assert np.all(d_emb[2] == 0.0)  # token 2 never appears


@pytest.mark.parametrize("one_hot_rows", [4096, 4])
def test_embedding_bwd_adds_every_occurrence_by_gemm_and_by_scatter(one_hot_rows, monkeypatch):
    """A table of at most `ONE_HOT_ROWS` rows takes its gradient as one GEMM, a larger one
    by np.add.at (4: this 5-row table goes that way): both add each occurrence's row, a
    repeated token's rows summed, into what the buffer already held."""
    monkeypatch.setattr(ops_numpy, "ONE_HOT_ROWS", one_hot_rows)
    rng = np.random.default_rng(3)
    tok = np.array([[1, 3, 1, 1], [4, 1, 0, 3]])
    dx = rng.normal(size=(2, 4, 6))
    before = rng.normal(size=(5, 6))
    d_emb = before.copy()
    OPS.embedding_bwd(d_emb, tok, dx)
    want = before.copy()
    for (b, t), row in np.ndenumerate(tok):
        want[row] += dx[b, t]
    np.testing.assert_allclose(d_emb, want, rtol=1e-14, atol=1e-15)
    assert np.array_equal(d_emb[2], before[2])  # token 2 never appears
