"""Online Platt scaling on the progressive-validation stream: it recovers a known
miscalibration, keeps the identity where a stale fit would hurt, never inverts the gate,
skips the burn-in, weighs a block pair as its copies, and gives the transformer's part
only the share it earns."""

from __future__ import annotations

import numpy as np

from gated.online import PlattCalibrator, brier_score, expected_calibration_error
from gated.online.monitor import Monitor


def test_platt_recovers_a_known_miscalibration_and_lowers_ece():
    rng = np.random.default_rng(0)
    z = rng.normal(0, 3, 4000)
    y = (rng.random(4000) < 1 / (1 + np.exp(-(0.4 * z - 0.8)))).astype(float)
    cal = PlattCalibrator(size=4000, refit_every=10**9, min_samples=1)
    for zi, yi in zip(z, y, strict=True):
        cal.update(zi, yi)
    cal.fit()
    assert abs(cal.a - 0.4) < 0.06 and abs(cal.b + 0.8) < 0.15
    raw = 1 / (1 + np.exp(-z))
    assert expected_calibration_error(cal(z), y) < 0.03 < expected_calibration_error(raw, y)
    assert brier_score(cal(z), y) < brier_score(raw, y)


def test_platt_keeps_the_identity_when_a_stale_fit_would_hurt_the_newest_pairs():
    """The model under the calibrator changes: logits of an early, badly biased model (the
    older pairs) must not set the map for a model that is now calibrated (the newest)."""
    rng = np.random.default_rng(1)
    cal = PlattCalibrator(size=2000, refit_every=10**9, min_samples=1)
    for i in range(2000):
        z = rng.normal(0, 3)
        shift = 2.5 if i < 1500 else 0.0  # early logits 2.5 too high; the newest honest
        y = float(rng.random() < 1 / (1 + np.exp(-(z - shift))))
        cal.update(z, y)
    cal.fit()
    assert cal.params == (1.0, 0.0, 0.0)
    # ...while a miscalibration that persists into the newest pairs is still corrected
    cal2 = PlattCalibrator(size=2000, refit_every=10**9, min_samples=1)
    for _ in range(2000):
        z = rng.normal(0, 3)
        cal2.update(z, float(rng.random() < 1 / (1 + np.exp(-(z - 2.5)))))
    cal2.fit()
    assert abs(cal2.b + 2.5) < 0.3


def test_the_bounded_intercept_is_the_constrained_optimum_and_leaves_a_negative_one():
    """`intercept_max` 0: on pairs whose best map has b > 0 the fit serves b = 0 and the
    best slope given it (KKT: the loss's gradient in a is 0, in b it points up the bound:
    the loss would fall only by raising b); on pairs whose best b is negative the bound
    changes nothing."""
    rng = np.random.default_rng(5)

    def fitted(b_true: float, bound: float) -> PlattCalibrator:
        cal = PlattCalibrator(size=4000, refit_every=10**9, min_samples=1, share_prior=0.0,
                              intercept_max=bound)
        for z in rng.normal(0, 3, 4000):  # no transformer part: d stays where it is
            cal.update(z, float(rng.random() < 1 / (1 + np.exp(-(0.7 * z + b_true)))))
        return cal

    def unbounded(cal: PlattCalibrator) -> PlattCalibrator:
        """The same pairs, fitted without the bound."""
        free = PlattCalibrator(size=4000, refit_every=10**9, min_samples=1, share_prior=0.0)
        for z, y in zip(cal.z, cal.y, strict=True):
            free.update(z, y)
        free.fit()
        return free

    cal = fitted(0.8, 0.0)
    free = unbounded(cal)
    cal.fit()
    assert free.b > 0.5 and cal.b == 0.0
    x, y, w = cal.pairs()
    theta = np.array(cal.params)
    u = x @ theta
    grad = x.T @ (w * (1 / (1 + np.exp(-u)) - y)) / w.sum() + cal.l2 * (theta - cal._prior)
    assert abs(grad[0]) < 1e-6 and grad[1] < -1e-3
    assert cal._loss(theta, x, y, w) > cal._loss(np.array(free.params), x, y, w)

    neg = fitted(-0.8, 0.0)
    neg.fit()
    assert neg.b < -0.5 and neg.params == unbounded(neg).params


def test_a_correction_relabels_the_calibration_pairs_of_its_call():
    cal = PlattCalibrator(min_samples=10**9)
    cal.update(2.0, 1.0, b"call-a")  # the gate allowed call a...
    cal.update(1.0, 1.0, b"call-b")
    cal.update(2.5, 1.0, b"call-a")
    assert cal.relabel(b"call-a", 0.0) == 2  # ...a person says it should have blocked
    assert list(cal.y) == [0.0, 1.0, 0.0]
    assert cal.relabel(b"call-a", 0.0) == 0 and cal.relabel(b"unknown", 1.0) == 0


def test_platt_is_identity_until_it_has_data_and_never_inverts_the_gate():
    cal = PlattCalibrator(min_samples=200)
    assert cal.params == (1.0, 0.0, 0.0) and float(cal(0.0)) == 0.5
    for _ in range(300):  # labels opposite to the logit: the fit would want a < 0
        cal.update(3.0, 0.0)
        cal.update(-3.0, 1.0)
    assert cal.a > 0


def test_the_burn_in_pairs_never_reach_the_calibration_map():
    """The first `burn_in` pairs were scored by a model that had barely begun: the map is
    fitted as if they had never been seen (docs/learning.md, "The first calibration fit")."""
    rng = np.random.default_rng(4)
    early = [(rng.normal(0, 0.3), float(rng.random() < 0.84)) for _ in range(300)]
    later = [(z, float(rng.random() < 1 / (1 + np.exp(-(0.5 * z - 1.0)))))
             for z in rng.normal(0, 3, 600)]
    burnt = PlattCalibrator(size=2000, refit_every=10**9, min_samples=1, burn_in=300)
    fresh = PlattCalibrator(size=2000, refit_every=10**9, min_samples=1)
    for z, y in early + later:
        burnt.update(z, y)
    for z, y in later:
        fresh.update(z, y)
    assert burnt.seen == 900 and list(burnt.z) == list(fresh.z) and len(burnt.z) == 600
    burnt.fit()
    fresh.fit()
    assert burnt.params == fresh.params and burnt.params != (1.0, 0.0, 0.0)
    # the same stream without the burn-in keeps the early pairs: a different map
    kept = PlattCalibrator(size=2000, refit_every=10**9, min_samples=1)
    for z, y in early + later:
        kept.update(z, y)
    kept.fit()
    assert kept.params != burnt.params


def test_a_block_pairs_weight_counts_as_that_many_copies_of_it_in_the_fit():
    """`block_weight`: a pair labelled block weighs w in the map's fit -- the weighted
    Newton solution is the unweighted one on the pairs with each block repeated w times
    (float64, exact up to the solver) -- an allow pair weighs 1 whatever it carries, and
    a relabelled pair takes its weight along. Heavier blocks lower the intercept: the
    map keeps the trainer's class weight instead of taking it back."""
    rng = np.random.default_rng(7)
    z = rng.normal(0.5, 2.0, 400)
    y = (rng.random(400) < 1 / (1 + np.exp(-(0.8 * z + 0.6)))).astype(float)
    weighted = PlattCalibrator(size=4000, refit_every=10**9, min_samples=1)
    copies = PlattCalibrator(size=4000, refit_every=10**9, min_samples=1)
    for zi, yi in zip(z, y, strict=True):
        weighted.update(zi, yi, block_weight=3.0)
        for _ in range(3 if yi < 0.5 else 1):
            copies.update(zi, yi, block_weight=7.0 if yi >= 0.5 else 1.0)  # allows: 1
    start = np.array([1.0, 0.0, 0.0])

    def solve(cal):
        return cal._newton(*cal.pairs(), start, 100)
    np.testing.assert_allclose(solve(weighted), solve(copies), rtol=0, atol=1e-7)
    plain = PlattCalibrator(size=4000, refit_every=10**9, min_samples=1)
    for zi, yi in zip(z, y, strict=True):
        plain.update(zi, yi)
    plain.fit()
    weighted.fit()
    assert weighted.b < plain.b - 0.3  # log(3) lower, near enough, if the fit is kept
    # a correction to block takes the pair's weight along; the state keeps the weights
    fp = b"call"
    cal = PlattCalibrator(size=10, refit_every=10**9, min_samples=1)
    cal.update(1.0, 1.0, fp, block_weight=2.0)
    assert cal.relabel(fp, 0.0) == 1 and list(cal.bw) == [2.0]
    restored = PlattCalibrator(size=10)
    restored.load(cal.state())
    assert list(restored.bw) == [2.0] and list(restored.y) == [0.0]


def test_the_burn_in_survives_a_restart_and_old_states_count_as_past_it():
    cal = PlattCalibrator(burn_in=10)
    for _ in range(7):
        cal.update(1.0, 1.0)
    restored = PlattCalibrator(burn_in=10)
    restored.load(cal.state())
    assert restored.seen == 7 and len(restored.z) == 0
    for _ in range(5):  # three more of the burn-in, then two kept
        restored.update(1.0, 1.0)
    assert len(restored.z) == 2
    old = cal.state() | {"z": [0.5] * 40, "zd": [0.0] * 40, "y": [1.0] * 40}
    del old["seen"]  # a checkpoint written before the burn-in existed
    del old["bw"]  # ... and before the block weights: every pair at weight 1
    before = PlattCalibrator(burn_in=500)
    before.load(old)
    assert before.seen == 500 and before.update(1.0, 1.0) is False and len(before.z) == 41
    assert list(before.bw) == [1.0] * 41


def test_the_monitor_keeps_no_calibration_pair_of_a_fresh_states_first_500():
    mon = Monitor()
    assert mon.settings.calibration_burn_in == 500
    for seq in range(1, 502):
        mon.observe(seq, b"x" * 16, None, 1.0, 2.0, 0.9)
    assert len(mon.calibrator.z) == 1 and mon.calibrator.seen == 501


def _two_part_fit(deep_weight: float, seed: int = 0) -> PlattCalibrator:
    """Pairs whose label follows z_wide + deep_weight * z_deep, with z = z_wide + z_deep."""
    rng = np.random.default_rng(seed)
    zw, zd = rng.normal(0, 3, 4000), rng.normal(0, 2, 4000)
    y = (rng.random(4000) < 1 / (1 + np.exp(-(zw + deep_weight * zd)))).astype(float)
    cal = PlattCalibrator(size=4000, refit_every=10**9, min_samples=1)
    for w, d, yi in zip(zw, zd, y, strict=True):
        cal.update(w + d, yi, z_deep=d)
    cal.fit()
    return cal


def test_the_transformers_share_is_what_its_part_earns_on_the_stream():
    """A transformer part that is noise is discounted to nothing (d = -a); one that is
    the signal keeps its share (d = 0); one worth more than its weight is not amplified."""
    noise = _two_part_fit(0.0)
    assert abs(noise.a - 1.0) < 0.1 and abs(noise.d + noise.a) < 0.05
    rng = np.random.default_rng(1)
    zw, zd = rng.normal(0, 3, 2000), rng.normal(0, 2, 2000)
    y = (rng.random(2000) < 1 / (1 + np.exp(-zw))).astype(float)

    def logloss(p):
        return -np.mean(y * np.log(p) + (1 - y) * np.log1p(-p))
    assert logloss(noise(zw + zd, zd)) < logloss(1 / (1 + np.exp(-(zw + zd)))) - 0.05
    signal = _two_part_fit(1.0)
    assert abs(signal.a - 1.0) < 0.1 and -0.1 < signal.d <= 0.0
    assert _two_part_fit(2.0).d == 0.0  # clipped: never more than its own weight
    half = _two_part_fit(0.5)
    assert -0.65 < half.d / half.a < -0.35  # share ~0.5


def test_served_probability_discounts_the_transformers_part_by_its_share():
    """serving.Calibration.of: with d = -a the served logit is the wide part's alone."""
    from gated.daemon.serving import Calibration
    from gated.engine import Model, ModelConfig, source_batch

    cfg = ModelConfig.tiny()
    model = Model.init(cfg, seed=0)
    rng = np.random.default_rng(0)
    model.params["wide.w"][...] = rng.normal(0, 0.5, model.params["wide.w"].shape)
    model.params["gate.w"][...] = rng.normal(0, 0.5, model.params["gate.w"].shape)
    src = source_batch([("fs.read {\"path\": \"a.py\"}", None),
                        ("shell.exec {\"cmd\": \"rm -rf /\"}", ["fs.read .env"])], cfg)
    z = model.predict_z(src)
    wide = model.wide_logit(src)
    assert np.all(np.abs(z - wide) > 1e-3)  # the transformer's part is not nothing
    np.testing.assert_allclose(Calibration(1.0, 0.0, -1.0).of(z, src, model),
                               1 / (1 + np.exp(-wide)), rtol=1e-9)
    np.testing.assert_allclose(Calibration(2.0, 0.5, -1.0).of(z, src, model),
                               1 / (1 + np.exp(-(2 * wide + z - wide + 0.5))), rtol=1e-9)
    np.testing.assert_allclose(Calibration(2.0, 0.5).of(z, src, model),
                               1 / (1 + np.exp(-(2 * z + 0.5))), rtol=1e-9)


def _share_fit(deep_weight: float, n: int, seed: int, deep_sd: float = 1.0) -> PlattCalibrator:
    """A gate with a wide path (share prior 0) on `n` pairs whose label follows z_wide +
    deep_weight * z_deep (z_wide's spread 2, z_deep's `deep_sd`)."""
    rng = np.random.default_rng(seed)
    zw, zd = rng.normal(0, 2, n), rng.normal(0, deep_sd, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(zw + deep_weight * zd)))).astype(float)
    cal = PlattCalibrator(size=n, refit_every=10**9, min_samples=1, share_prior=0.0)
    for w, d, yi in zip(zw, zd, y, strict=True):
        cal.update(w + d, yi, z_deep=d)
    cal.fit()
    return cal


def test_a_share_the_newest_pairs_do_not_clearly_support_stays_at_its_prior():
    """A transformer part that carries nothing: the free fit gives it a small share by
    chance on some draws (its d sits inside [-a, 0]); the map keeps the prior share, 0,
    on every draw, since the newest quarter shows no gain beyond two standard errors."""
    for seed in range(8):
        cal = _share_fit(0.0, 600, seed)
        assert cal.d == -cal.a, f"seed {seed}: share {(cal.a + cal.d) / cal.a:.3f}"
    # ...while a part that is half the signal earns its whole share on as few pairs
    earned = [_share_fit(1.0, 600, seed, deep_sd=2.0) for seed in range(8)]
    assert all((c.a + c.d) / c.a > 0.8 for c in earned), [c.params for c in earned]
