"""The wide path's pair term and history veto (engine/wide_logit.py, wide_learner.py): exact
gradients (float64, central differences), the doubt and the contradiction hold, the GPU
path's segment sums, a bag's members, and that the pair term learns the history rule that
the crosses learn slowly."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from config_history import fingerprint_before
from gradcheck import numeric_grad_entries, rel_error, weighted_bce

from gated.engine import Model, ModelConfig, source_batch
from gated.engine.wide import MAX_STRUCTURED, NOVEL_AT, PAIR_KEYS
from gated.engine.wide_learner import NO_DOUBT, WideAdaGrad, WideBag
from gated.engine.wide_logit import pair_logit, segment_sum, veto_combine


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
        return weighted_bce(z, label, weight) + 0.5 * 1e-3 * reg

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
        return weighted_bce(z_of(), label, weight) + 0.5 * 1e-3 * reg

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
    bag.lr, bag.pair_first, bag.rule_blocks_pair_only = 0.2, False, True  # a reload's
    assert all(s.lr == 0.2 and not s.pair_first and s.rule_blocks_pair_only  # settings
               for s in bag.learners)  # reach every member
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
    assert before.fingerprint() == fingerprint_before(  # as before
        before, "wide_pair_history", "wide_bias", "wide_familiarity", "wide_novel_destinations")
    assert flint.fingerprint() != before.fingerprint()
    with pytest.raises(ValueError, match="wide_pair_history"):
        ModelConfig(wide_pair_history=-1)


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


@pytest.mark.parametrize("first", [True, False])
def test_a_history_rule_block_steps_the_pair_term_alone(first: bool):
    """`rule_blocks_pair_only`: a "block" of a call whose pair features hold a destination
    row (`pair_features` gives one only to an upload after a credential-file read) steps
    the pair tables exactly as without the option and leaves the linear weights and their
    sums as they were; an "allow" of that call, a "block" without a destination row and
    the option off step the linear weights too."""
    rng = np.random.default_rng(5)
    w0, u0, v0 = rng.normal(size=32), rng.normal(size=(20, 3)), rng.normal(size=(16, 3))
    idx, val = np.array([0, 4, 7]), rng.normal(size=3)
    site = (np.array([2, 5]), np.array([0.6, 0.8]))
    read = (np.array([1, 9]), np.array([1.0, 1.0]), np.array([0, 0]))
    rule = (np.append(site[0], 17), np.append(site[1], 1.0), *read)  # row 17: a destination
    plain = (*site, *read)

    def learner(on: bool) -> WideAdaGrad:
        return WideAdaGrad(w0.copy(), np.ones(32), scale=1.0, l2=1e-3, pool=0.5,
                           pair=(u0.copy(), np.ones((20, 3)), v0.copy(), np.ones((16, 3))),
                           pair_first=first, destination_rows=4, rule_blocks_pair_only=on)

    def after(on: bool, label: float, pair) -> WideAdaGrad:
        one = learner(on)
        one.learn(idx, val, 0.0, label, 1.0, pair)
        return one

    held, off = after(True, 0.0, rule), after(False, 0.0, rule)
    np.testing.assert_array_equal(held.w, w0)  # the linear weights did not learn it
    np.testing.assert_array_equal(held.g2, np.ones(32))  # nor their sums
    if first:  # the pair term's step comes first either way: the same step
        np.testing.assert_array_equal(held.pair[0], off.pair[0])
        np.testing.assert_array_equal(held.pair[2], off.pair[2])
    else:  # the joint step: the pair term's gradient is at the same weights either way
        np.testing.assert_allclose(held.pair[0], off.pair[0], rtol=1e-12)
    assert not np.array_equal(held.pair[0], u0)  # and it did learn
    assert not np.array_equal(off.w, w0)  # the option off: the linear weights learn
    assert not np.array_equal(after(True, 1.0, rule).w, w0)  # an allow of the call
    assert not np.array_equal(after(True, 0.0, plain).w, w0)  # a block, no destination row
    assert not np.array_equal(after(True, 0.0, None).w, w0)  # a block, no pair features
