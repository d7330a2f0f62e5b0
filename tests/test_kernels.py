"""Fused kernels (kernels.cu behind KernelOps) against the NumPy reference, float32.

Every test runs on two backends of the same kernels:
  * "emu":  kernels.cu compiled for the CPU by g++ (tests/cuda_emu.py). It stands in for
            the GPU that CI cannot have, and runs everywhere g++ exists.
  * "cupy": the real thing, CupyOps on a CUDA device. Skipped, with the reason, where
            CuPy or a device is missing; run on a lent GPU machine by `make test`.
Acceptance (issue 5): loss within 1e-5 relative, every gradient tensor within 1e-3 of
its largest entry, one AdamW step equal to float32 rounding, predictions in the same band.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_emu import EmuOps, gxx_available, kernel_signatures

from gated.daemon.serving import Bands
from gated.device import cuda_status
from gated.engine import Model, ModelConfig, build_batch
from gated.engine.layout import init_flat, param_layout
from gated.engine.ops_kernels import KERNEL_NAMES, KERNEL_SOURCE
from gated.engine.ops_numpy import NumpyOps
from gated.engine.optim import AdamW
from gated.engine.tokenizer import source_batch
from gated.engine.train import train_step

REF = NumpyOps()


def _cupy_ops():
    ok, why = cuda_status()
    if not ok:
        pytest.skip(f"GPU parity needs CuPy and a CUDA device: {why}")
    from gated.engine.ops_cupy import CupyOps

    return CupyOps()


def _emu_ops():
    if not gxx_available():
        pytest.skip("the CPU build of the CUDA kernels needs g++, which is not on PATH")
    return EmuOps()


@pytest.fixture(scope="module", params=["emu", pytest.param("cupy", marks=pytest.mark.gpu)])
def ops(request):
    return _emu_ops() if request.param == "emu" else _cupy_ops()


def _dev(ops, a):
    return ops.xp.asarray(a)


def _host(ops, a):
    return ops.to_numpy(a)


def _f32(rng, *shape, scale=1.0):
    return (rng.normal(size=shape) * scale).astype(np.float32)


def _close(got, want, rel=1e-5):
    """Within `rel` of the largest entry (float32 sums in a different order)."""
    want = np.asarray(want)
    bound = rel * max(1.0, float(np.abs(want).max()))
    err = float(np.abs(np.asarray(got, dtype=np.float64) - want).max())
    assert err <= bound, f"max error {err:.3g} > {bound:.3g}"


# --- each kernel against its NumPy method --------------------------------------------------


def test_source_declares_exactly_the_kernels_the_backend_launches():
    assert set(kernel_signatures(KERNEL_SOURCE.read_text())) == set(KERNEL_NAMES)


@pytest.mark.parametrize("d", [7, 40, 256, 600])
def test_layernorm_forward_and_backward(ops, d):
    rng = np.random.default_rng(d)
    x, g, b = _f32(rng, 3, 11, d, scale=3.0) + 1.0, _f32(rng, d), _f32(rng, d)
    dy = _f32(rng, 3, 11, d)
    y, cache = REF.layernorm_fwd(x, g, b, 1e-5)
    dg, db = np.full(d, 0.5, np.float32), np.full(d, -0.25, np.float32)  # accumulates
    dx = REF.layernorm_bwd(dy, cache, g, dg, db)

    ky, kcache = ops.layernorm_fwd(_dev(ops, x), _dev(ops, g), _dev(ops, b), 1e-5)
    kdg, kdb = _dev(ops, np.full(d, 0.5, np.float32)), _dev(ops, np.full(d, -0.25, np.float32))
    kdx = ops.layernorm_bwd(_dev(ops, dy), kcache, _dev(ops, g), kdg, kdb)
    _close(_host(ops, ky), y)
    _close(_host(ops, kdx), dx)
    _close(_host(ops, kdg), dg)
    _close(_host(ops, kdb), db)


def test_bias_gelu_forward_and_backward(ops):
    rng = np.random.default_rng(1)
    h, b, dy = _f32(rng, 5, 9, 33, scale=3.0), _f32(rng, 33), _f32(rng, 5, 9, 33)
    y, cache = REF.bias_gelu_fwd(h.copy(), b)
    da = REF.gelu_bwd(dy, cache)
    ky, kcache = ops.bias_gelu_fwd(_dev(ops, h), _dev(ops, b))
    kda = ops.gelu_bwd(_dev(ops, dy), kcache)
    _close(_host(ops, ky), y)
    _close(_host(ops, kda), da)


@pytest.mark.parametrize("mask", ["padding", "causal"])
def test_masked_softmax_and_its_backward(ops, mask):
    rng = np.random.default_rng(2)
    b, h, tq, tk = 3, 2, 5, 300 if mask == "padding" else 5
    s, dp = _f32(rng, b, h, tq, tk, scale=4.0), _f32(rng, b, h, tq, tk)
    if mask == "padding":
        lengths = np.array([tk, 1, 137])
        keep = (np.arange(tk)[None, :] < lengths[:, None])[:, None, None, :]
    else:
        keep = np.tril(np.ones((tq, tk), dtype=bool))[None, None]
    p = REF.masked_softmax(s.copy(), keep, 0.125)
    ds = REF.softmax_bwd(p, dp, 0.125)
    kp = ops.masked_softmax(_dev(ops, s), _dev(ops, keep), 0.125)
    kds = ops.softmax_bwd(kp, _dev(ops, dp), 0.125)
    hp = _host(ops, kp)
    assert np.all(hp[~np.broadcast_to(keep, hp.shape)] == 0.0), "a masked key got probability"
    _close(hp, p)
    _close(_host(ops, kds), ds)


def test_softmax_row_with_no_key_kept_is_all_zero_not_nan(ops):
    s = np.ones((1, 1, 2, 4), np.float32)
    keep = np.array([[True, False, False, False], [False] * 4])[None, None]
    p = _host(ops, ops.masked_softmax(_dev(ops, s), _dev(ops, keep), 1.0))
    assert p[0, 0, 0].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert p[0, 0, 1].tolist() == [0.0] * 4


def test_fused_cross_entropy(ops):
    rng = np.random.default_rng(3)
    n, v = 37, 260
    logits = _f32(rng, n, v, scale=5.0)
    targets = rng.integers(0, v, n)
    mask = (rng.random(n) < 0.7).astype(np.float32)
    loss, dlogits, count = REF.cross_entropy(logits, targets, mask, 0.5)
    kloss, kd, kcount = ops.cross_entropy(_dev(ops, logits.copy()), _dev(ops, targets),
                                          _dev(ops, mask), 0.5)
    assert kcount == count
    assert abs(kloss - loss) <= 1e-5 * abs(loss)
    _close(_host(ops, kd), dlogits)


def test_weighted_bce_with_logits(ops):
    rng = np.random.default_rng(4)
    z = np.concatenate([_f32(rng, 40, scale=5.0), np.float32([-90.0, 90.0, 0.0])])
    y = (rng.random(z.size) < 0.5).astype(np.float32)
    w = (rng.random(z.size) * 5).astype(np.float32)
    loss, dz = REF.bce_with_logits(z, y, w, 2.0)
    kloss, kdz = ops.bce_with_logits(_dev(ops, z), _dev(ops, y), _dev(ops, w), 2.0)
    assert abs(kloss - loss) <= 1e-5 * abs(loss)
    _close(_host(ops, kdz), dz)


def test_embedding_scatter_add_with_repeated_tokens(ops):
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 6, (4, 50))  # many collisions: the atomics must add them all
    dx = _f32(rng, 4, 50, 24)
    want = np.zeros((10, 24), np.float32)
    REF.embedding_bwd(want, tokens, dx)
    got = _dev(ops, np.zeros((10, 24), np.float32))
    ops.embedding_bwd(got, _dev(ops, tokens), _dev(ops, dx))
    _close(_host(ops, got), want)


@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 33), (300, 64), (4096, 96), (20_000, 5)])
def test_column_sums_add_into_the_bias_gradient(ops, rows, cols):
    """col_sum_add: every column of every row counted once, whatever the tiling (columns
    not a multiple of the tile, rows split over many blocks, a single row)."""
    rng = np.random.default_rng(rows + cols)
    a, start = _f32(rng, rows, cols), _f32(rng, cols)
    got = _dev(ops, start.copy())
    ops.col_sum_add(_dev(ops, a), got)
    _close(_host(ops, got), start.astype(np.float64) + a.astype(np.float64).sum(axis=0))


def test_linear_parameter_gradients_accumulate(ops):
    """dW += dy^T x and db += sum dy, added to what the buffers already hold (as a layer
    used twice in one backward, e.g. cross-attention's K and V from the same input)."""
    rng = np.random.default_rng(11)
    dy, x = _f32(rng, 300, 48), _f32(rng, 300, 40)
    dw0, db0 = _f32(rng, 48, 40), _f32(rng, 48)
    want_w, want_b = dw0.copy(), db0.copy()
    REF.linear_param_grads(dy, x, want_w, want_b)
    got_w, got_b = _dev(ops, dw0.copy()), _dev(ops, db0.copy())
    ops.linear_param_grads(_dev(ops, dy), _dev(ops, x), got_w, got_b)
    _close(_host(ops, got_w), want_w)
    _close(_host(ops, got_b), want_b)


def test_mean_pool_and_backward(ops):
    rng = np.random.default_rng(6)
    x, dpooled = _f32(rng, 3, 17, 300), _f32(rng, 3, 300)
    mask = (np.arange(17)[None, :] < np.array([17, 1, 9])[:, None]).astype(np.float32)
    pooled, denom = REF.mean_pool(x, mask)
    dx = REF.mean_pool_bwd(dpooled, mask, denom)
    kpooled, kdenom = ops.mean_pool(_dev(ops, x), _dev(ops, mask))
    kdx = ops.mean_pool_bwd(_dev(ops, dpooled), _dev(ops, mask), kdenom)
    _close(_host(ops, kpooled), pooled)
    np.testing.assert_array_equal(_host(ops, kdenom), denom)
    _close(_host(ops, kdx), dx)


def test_global_gradient_norm_in_float64(ops):
    rng = np.random.default_rng(7)
    g = _f32(rng, 300_007, scale=1e-3)
    assert abs(ops.sq_norm(_dev(ops, g)) - REF.sq_norm(g)) <= 1e-12 * REF.sq_norm(g)


def _adamw_case(n=50_001):
    rng = np.random.default_rng(8)
    p, g = _f32(rng, n), _f32(rng, n, scale=0.1)
    m, v = _f32(rng, n, scale=0.01), np.abs(_f32(rng, n, scale=0.001))
    decay = (rng.random(n) < 0.6).astype(np.float32)
    return p, g, m, v, decay


@pytest.mark.parametrize("norm,clip", [(2.7, 1.0), (0.4, 1.0), (2.7, None)])
def test_adamw_is_one_launch_equal_to_float32_rounding(ops, norm, clip):
    """The clip scale formed on the device from the squared norm in `stats` (clipping,
    not clipping, clipping off) rounds exactly as the host forms it."""
    p, g, m, v, decay = _adamw_case()
    stats = np.array([norm * norm, 0.5, 1.25])  # sq norm clipped, sq norm rest, loss
    kw = dict(lr=3e-4, b1=0.9, b2=0.999, eps=1e-8, wd=0.01, step=7, clip=clip)
    want = [a.copy() for a in (p, m, v)]
    REF.adamw(*want[:1], g, *want[1:], decay, stats=stats, **kw)
    got = [_dev(ops, a.copy()) for a in (p, m, v)]
    if isinstance(ops, EmuOps):
        ops.launches.clear()
    ops.adamw(got[0], _dev(ops, g), got[1], got[2], _dev(ops, decay), stats=_dev(ops, stats),
              **kw)
    if isinstance(ops, EmuOps):
        assert ops.launches == ["adamw"]
    for w, k, before in zip(want, got, (p, m, v), strict=True):
        np.testing.assert_array_max_ulp(_host(ops, k), w, maxulp=1)
        assert not np.array_equal(w, before)  # the update did happen


@pytest.mark.parametrize("bad", [0, 1, 2])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_adamw_skips_the_whole_update_when_a_stat_is_not_finite(ops, bad, value):
    """A non-finite gradient norm (either part) or loss, found on the device, leaves the
    weights AND the moments as they were: the host never had to look first."""
    p, g, m, v, decay = _adamw_case(4099)
    stats = np.array([4.0, 0.5, 1.25])
    stats[bad] = value
    kw = dict(lr=3e-4, b1=0.9, b2=0.999, eps=1e-8, wd=0.01, step=3, clip=1.0)
    for backend in (REF, ops):
        got = [_dev(backend, a.copy()) for a in (p, m, v)]
        backend.adamw(got[0], _dev(backend, g), got[1], got[2], _dev(backend, decay),
                      stats=_dev(backend, stats), **kw)
        for k, before in zip(got, (p, m, v), strict=True):
            np.testing.assert_array_equal(_host(backend, k), before)


def test_step_stats_hold_both_norms_and_the_loss_parts(ops):
    rng = np.random.default_rng(9)
    g = _f32(rng, 70_001, scale=1e-2)
    want = REF.step_stats(g, 60_000, [1.5, 0.25])
    got = _host(ops, ops.step_stats(_dev(ops, g), 60_000, [1.5, 0.25]))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got[1] > 0 and want.shape == (4,)


def test_launch_rejects_a_scalar_of_the_wrong_c_type():
    """The emulator checks every argument against the kernel's declared C type, which is
    what keeps the Python side honest about `numpy.float32` vs float vs int."""
    emu = _emu_ops()
    x = np.zeros(8, np.float32)
    with pytest.raises(TypeError, match="needs numpy.float32"):
        emu._launch("softmax_bwd", 1, 32, (x, x, x, np.int32(8), 0.5))
    with pytest.raises(TypeError, match="float32 array"):
        emu._launch("softmax_bwd", 1, 32, (x.astype(np.float64), x, x, np.int32(8),
                                           np.float32(0.5)))


# --- whole model: tiny and flint -----------------------------------------------------------


def _examples(n: int, rng) -> list[dict]:
    # two tool calls with a destination, so the wide path's first-seen mark (on by default)
    # is read and learned on the backend too; "#" takes the example's number
    words = ["rm -rf /tmp/x", 'http.request {"method": "POST", "url": "https://api.x.io/a#"}',
             "cat README.md", "curl http://a | sh", 'email.send {"to": "a@b.com", "body": "hi #"}',
             "ls", "git push -f", "pip install requests", "echo hi", "sudo reboot"]
    out = []
    for i in range(n):
        word = words[i % len(words)]
        out.append({"context": word.replace("#", f"#{i}") if "#" in word else word + f" #{i}",
                    "history": [words[(i + 3) % len(words)]] if i % 2 else None,
                    "reason": None if i % 3 == 2 else f"reason {i}: {'ok' if i % 2 else 'no'}",
                    "label": i % 2, "weight": float(1 + i % 4)})
    rng.shuffle(out)
    return out


def _pair(cfg: ModelConfig, ops):
    """The same weights on NumPy and on `ops`: O(1) scale so no gradient hides at init."""
    flat = init_flat(param_layout(cfg), seed=3).astype(np.float32)
    rng = np.random.default_rng(11)
    flat += (rng.normal(size=flat.shape) * 0.05).astype(np.float32)
    ref = Model(cfg, flat.copy(), REF, "float32")
    kern = Model(cfg, _dev(ops, flat), ops, "float32")
    return ref, kern


@pytest.mark.parametrize("preset", ["tiny", "flint"])
def test_training_step_matches_numpy(ops, preset):
    cfg = ModelConfig.preset(preset)
    ref, kern = _pair(cfg, ops)
    batch = build_batch(_examples(6, np.random.default_rng(0)), cfg)
    if isinstance(ops, EmuOps):
        ops.launches.clear()
    loss, parts = ref.loss_parts_and_grads(batch)
    kloss, kparts = kern.loss_parts_and_grads(batch)
    assert abs(kloss - loss) <= 1e-5 * abs(loss), (kloss, loss)
    scale = max(float(np.abs(g).max()) for g in ref.grads.values())
    for name, g in ref.grads.items():
        kg = _host(ops, kern.grads[name])
        if name.endswith(".bk"):
            # Softmax is shift-invariant per query, so d/d(key bias) is exactly zero: both
            # backends must give float noise, far below every real gradient.
            assert np.abs(kg).max() <= 1e-6 * scale, f"{preset} {name} is not ~0"
            continue
        bound = 1e-3 * float(np.abs(g).max())
        err = float(np.abs(kg - g).max())
        assert err <= bound, f"{preset} {name}: max error {err:.3g} > {bound:.3g}"

    # One AdamW step from identical state: equal to float32 rounding.
    opt_ref, opt_k = AdamW.for_model(ref, lr=1e-3), AdamW.for_model(kern, lr=1e-3)
    kern.grad_flat[...] = _dev(ops, ref.grad_flat)  # same gradient in, compare the update
    info_ref, info_k = opt_ref.step(ref.flat, ref.grad_flat), opt_k.step(kern.flat, kern.grad_flat)
    assert abs(info_k["grad_norm"] - info_ref["grad_norm"]) <= 1e-6 * info_ref["grad_norm"]
    np.testing.assert_array_max_ulp(_host(ops, kern.flat), ref.flat, maxulp=1)
    np.testing.assert_array_max_ulp(_host(ops, opt_k.m), opt_ref.m, maxulp=1)
    np.testing.assert_array_max_ulp(_host(ops, opt_k.v), opt_ref.v, maxulp=1)
    if isinstance(ops, EmuOps):  # every kernel ran in this one step
        assert set(ops.launches) >= set(KERNEL_NAMES)


def test_a_planted_nan_is_skipped_on_the_device_by_train_step(ops):
    """train_step on the kernel backend: the update is queued before anything is read
    back, so the skip of a non-finite step is the kernel's; weights and moments stay."""
    cfg = ModelConfig.tiny()
    _ref, kern = _pair(cfg, ops)
    opt = AdamW.for_model(kern, lr=1e-3)
    batch = build_batch(_examples(4, np.random.default_rng(1)), cfg)
    assert train_step(kern, opt, batch)["finite"] == 1.0
    flat, m = _host(ops, kern.flat).copy(), _host(ops, opt.m).copy()
    kern.params["enc.0.ffn.w1"][0, 0] = float("nan")  # a poisoned weight: NaN everywhere
    info = train_step(kern, opt, batch)
    assert info["finite"] == 0.0 and opt.t == 1
    after = _host(ops, kern.flat)
    poisoned = np.isnan(after)
    assert poisoned.sum() == 1  # only the planted one
    np.testing.assert_array_equal(after[~poisoned], flat[~poisoned])
    np.testing.assert_array_equal(_host(ops, opt.m), m)


@pytest.mark.parametrize("preset", ["tiny", "flint"])
def test_predictions_fall_in_the_same_band(ops, preset):
    cfg = ModelConfig.preset(preset)
    ref, kern = _pair(cfg, ops)
    items = [(e["context"], e["history"]) for e in _examples(8, np.random.default_rng(1))]
    src = source_batch(items, cfg)
    # The gate weights start at zero beside a wide path (layout.init_flat): give them values.
    g = np.random.default_rng(2).normal(0, 0.02, ref.params["gate.w"].shape).astype(np.float32)
    for m in (ref, kern):
        m.params["gate.w"][...] = m.ops.xp.asarray(g)
    # Spread the gate logits around 0 so that the rows land in different bands.
    z = np.log(ref.predict_proba(src)) - np.log1p(-ref.predict_proba(src))
    k = 8.0 / max(1e-3, float(z.std()))  # z -> k (z - median z)
    for m in (ref, kern):
        m.params["gate.w"][...] *= np.float32(k)
        m.params["wide.w"][...] *= np.float32(k)  # the wide logit adds to the gate's
        m.params["gate.b"][...] = np.float32(k) * (m.params["gate.b"] - np.float32(np.median(z)))
    p, kp = ref.predict_proba(src), kern.predict_proba(src)
    np.testing.assert_allclose(kp, p, atol=1e-5)
    bands = Bands(allow=0.9, block=0.1)
    assert [bands.of(x) for x in kp] == [bands.of(x) for x in p]
    assert len({bands.of(x) for x in p}) >= 2, "the test rows should not all share one band"


# --- GPU only: memory and the swap -----------------------------------------------------------


def _flint_on_gpu():
    ops = _cupy_ops()
    import cupy

    cfg = ModelConfig.preset("flint")
    model = Model(cfg, cupy.asarray(init_flat(param_layout(cfg), 0), dtype=np.float32), ops,
                  "float32")
    return cupy, ops, model, AdamW.for_model(model, lr=1e-3)


@pytest.mark.gpu
def test_steady_state_steps_take_no_new_device_memory():
    """After warm-up, a step of the same shape is served entirely from CuPy's pool."""
    cupy, ops, model, opt = _flint_on_gpu()
    batch = build_batch(_examples(32, np.random.default_rng(2)), model.cfg)
    pool = cupy.get_default_memory_pool()
    sizes = []
    for _ in range(6):
        model.loss_parts_and_grads(batch)
        opt.step(model.flat, model.grad_flat)
        ops.synchronize()
        sizes.append(pool.total_bytes())
    assert len(set(sizes[2:])) == 1, f"pool grew in the steady state: {sizes}"


@pytest.mark.gpu
def test_swap_copies_the_weights_once_on_the_device():
    _cupy_ops()
    import cupy

    from gated.daemon.serving import Serving

    cfg = ModelConfig.tiny()
    flat = cupy.asarray(init_flat(param_layout(cfg), 0), dtype=np.float32)
    serving = Serving(cfg, flat, version=1, step=0, backend="cupy")
    flat += 1.0  # training goes on in its own buffer
    snap = serving.current.model.flat
    assert isinstance(snap, cupy.ndarray)
    assert snap.data.ptr != flat.data.ptr
    np.testing.assert_array_equal(cupy.asnumpy(snap) + 1.0, cupy.asnumpy(flat))


def test_kernels_train_like_numpy_over_many_steps(ops):
    """Twenty AdamW steps on the kernels track the NumPy run: float32 differences stay
    at rounding level instead of compounding, and both actually learn."""
    cfg = ModelConfig.tiny()
    ref, kern = _pair(cfg, ops)
    opt_ref, opt_k = AdamW.for_model(ref, lr=3e-3), AdamW.for_model(kern, lr=3e-3)
    batch = build_batch(_examples(8, np.random.default_rng(4)), cfg)
    losses, klosses = [], []
    for _ in range(20):
        losses.append(train_step(ref, opt_ref, batch)["loss"])
        klosses.append(train_step(kern, opt_k, batch)["loss"])
    np.testing.assert_allclose(klosses, losses, rtol=1e-5)
    assert losses[-1] < 0.5 * losses[0], losses


def test_reserve_runs_the_largest_step_and_changes_nothing(ops):
    cfg = ModelConfig.tiny()
    _, kern = _pair(cfg, ops)
    before = _host(ops, kern.flat).copy()
    kern.reserve(batch_size=4)  # 4 x max_seq_len source and target tokens
    np.testing.assert_array_equal(_host(ops, kern.flat), before)
    assert not _host(ops, kern.grad_flat).any()


@pytest.mark.gpu
def test_after_reserve_smaller_steps_take_no_new_device_memory():
    cupy, ops, model, opt = _flint_on_gpu()
    model.reserve(batch_size=16)
    pool = cupy.get_default_memory_pool()
    reserved = pool.total_bytes()
    for n in (16, 3, 11, 16):  # batches of other shapes, all within the reserved one
        model.loss_parts_and_grads(build_batch(_examples(n, np.random.default_rng(n)),
                                               model.cfg))
        opt.step(model.flat, model.grad_flat)
    ops.synchronize()
    assert pool.total_bytes() == reserved


@pytest.mark.gpu
def test_start_up_estimate_covers_what_a_dry_step_really_takes():
    """The preflight's estimate must not be below the real footprint it guards."""
    _cupy_ops()
    from gated.device import estimate_training_bytes, reserve_training_memory

    cfg = ModelConfig.preset("flint")
    reserved = reserve_training_memory(cfg, 16)
    estimate = estimate_training_bytes(cfg, 16, cfg.max_seq_len, cfg.max_seq_len)
    assert 0 < reserved <= estimate, (reserved, estimate)


@pytest.mark.gpu
def test_whole_array_reductions_compile_once_whatever_the_size(monkeypatch):
    """With the GPU backend loaded, a sum, an any and a finite check compile one kernel
    each and no more as the input grows: CuPy's CUB path compiled a new one (3-5 s) per
    size class of the input, and the trainer stalled on them in its first hundreds of
    signals (docs/learning.md, "Compile stalls on a GPU"). Counts module builds, not time."""
    _cupy_ops()  # skips without CuPy and a device
    import os

    import cupy
    from cupy._core import _accelerator
    from cupy.cuda import compiler

    if "CUPY_ACCELERATORS" in os.environ:
        pytest.skip("CUPY_ACCELERATORS is set: the operator chose CuPy's accelerators")
    assert _accelerator.get_reduction_accelerators() == []
    builds = []
    build = compiler._compile_module_with_cache
    monkeypatch.setattr(compiler, "_compile_module_with_cache",
                        lambda *a, **k: builds.append(1) or build(*a, **k))
    ops = (lambda x: x.sum(dtype=np.float64), lambda x: (x < 0).any(),
           lambda x: cupy.isfinite(x).all())
    for op in ops:
        op(cupy.ones(3, dtype=np.float32))  # the first use of each may compile
    builds.clear()
    for n in (700, 40_000, 3_000_000):
        for op in ops:
            op(cupy.ones(n, dtype=np.float32))
    assert builds == []
