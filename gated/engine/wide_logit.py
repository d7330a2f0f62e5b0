"""The wide path's logit from its features: the call x history pair term, how it joins
the linear logit, and the bag's layout in the wide tables.

wide.py turns a call and its history into sparse features (hashed n-grams, structured
keys) and wide_pair.py says what each side of the pair term is made of; this module is
the arithmetic on them that the model's forward and backward (model.py), the wide
learner (wide_learner.py) and the inference plan (infer.py) share, with the derivatives
the exact gradients need beside each value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .wide import NGRAM_END, NOVEL_AT, PAIR_KEYS


def pair_logit(call_rows, call_val, hist_rows, hist_val, pool: float = 0.0, xp=np,
               hist_grp=None):
    """The call x history pair term of a batch, from the gathered rows ``U[call_idx]``
    [B, Kc, rank] and ``V[hist_idx]`` [B, Kh, rank] (NumPy or CuPy alike, `xp`), and the
    history entry of every key ``hist_grp`` [B, Kh] (None: each key its own entry).

    u = sum_k call_val[b,k] U[c_k] (the call's site); each history key scores
    s_k = hist_val[b,k] <V[h_k], u>, each history entry S_e = sum_{k in e} s_k, and

    - `pool` = 0: z_pair = sum_k s_k = <u, v>, v = sum_k hist_val V[h_k];
    - `pool` = tau > 0: z_pair = sum_e a_e S_e, a = softmax(-S / tau) over the row's
      entries (padding, value 0, excluded): a soft minimum, so the entry that speaks most
      for "block" carries the term. Why (docs/learning.md, "Pooling the history"): the
      history rule is "ONE earlier read makes this call an exfiltration"; with a sum,
      every file a session touched before an exfiltration takes a share of the blame and
      an outbound call after an ordinary history looks suspicious; with the soft minimum
      the blame goes to the read that already explains it best (multiple-instance
      learning), and the other entries are left alone.

    Returns (z_pair [B], u [B, rank], v_eff [B, rank], hw [B, Kh]) with v_eff =
    dz_pair/du = sum_k hw_k V[h_k] and hw_k = dz_pair/ds_k * hist_val_k, so that, exactly
    (tests/test_wide_pair.py checks both against central differences):
    d z_pair / d U[c] = sum_{k: c_k = c} call_val[b,k] v_eff[b], and
    d z_pair / d V[h] = sum_{k: h_k = h} hw[b,k] u[b]  (a scatter-add each);
    for the soft minimum dz_pair/ds_k = dz_pair/dS_e(k) = a_e (1 - (S_e - z_pair) / tau)."""
    u = (call_val[:, :, None] * call_rows).sum(axis=1)
    if not pool:
        v = (hist_val[:, :, None] * hist_rows).sum(axis=1)
        return (u * v).sum(axis=1), u, v, hist_val
    s = hist_val * (hist_rows * u[:, None, :]).sum(axis=2)  # [B, Kh]; padding: 0
    rows, n_keys = s.shape
    grp = (xp.broadcast_to(xp.arange(n_keys)[None, :], s.shape) if hist_grp is None
           else xp.asarray(hist_grp))
    # entry e of row b is slot b * Kh + e (E <= Kh entries a row): scatter-add the keys'
    # scores into their entries, and count each entry's live (non-padding) keys
    slot = (xp.arange(rows)[:, None] * n_keys + grp).ravel()
    big_s = segment_sum(slot, s.ravel(), rows * n_keys, xp)
    big_s = big_s.reshape(rows, n_keys).astype(s.dtype, copy=False)  # [B, E]
    live = segment_sum(slot, (hist_val != 0).ravel().astype(s.dtype), rows * n_keys,
                       xp).reshape(rows, n_keys) > 0
    lowest = xp.where(live, big_s, xp.inf).min(axis=1, keepdims=True)
    lowest = xp.where(xp.isfinite(lowest), lowest, 0.0)  # a row without keys
    e = xp.exp(xp.where(live, -(big_s - lowest) / pool, -xp.inf))
    total = e.sum(axis=1, keepdims=True)  # >= 1 where the row has keys (its lowest: e = 1)
    a = e / xp.where(total > 0, total, 1.0)
    z = (a * big_s).sum(axis=1)
    d_entry = a * (1.0 - (big_s - z[:, None]) / pool)  # dz_pair/dS_e
    hw = xp.take_along_axis(d_entry, grp, axis=1) * hist_val  # its entry's dz/dS_e, per key
    return z, u, (hw[:, :, None] * hist_rows).sum(axis=1), hw


def segment_sum(slot, weights, n: int, xp=np):
    """out[j] = sum of `weights` where `slot` == j, for j < `n`, in float64: NumPy's
    bincount on the host; on a GPU `add.at` into zeros (a scatter-add: one atomicAdd
    kernel, compiled once).

    Why not cupy.bincount (measured on an H200, docs/learning.md "Compile stalls on a
    GPU"): it reads max(slot) and any(slot < 0) back to the host first, two full
    reductions that CuPy compiled anew for each new size of the batch (~2.5 s each), in
    the middle of scoring and training steps, for the first hundreds of signals."""
    if xp is np:
        return np.bincount(slot, weights=weights, minlength=n)
    out = xp.zeros(n, dtype=np.float64)
    xp.add.at(out, slot, weights.astype(np.float64, copy=False))
    return out


#: a Python float (weak in NumPy's promotion: a float32 logit stays float32)
_LOG2 = math.log(2.0)


def veto_combine(z_lin, z_pair, veto: float, xp=np, block_only: bool = False):
    """The wide logit from its linear part and its pair term, with the history as a veto.

    `block_only` first bounds the pair term from above: p = log(2 sigmoid(z_pair)) (0 at
    z_pair = 0, below log 2 always, ~ z_pair + log 2 when it says "block"), dp/dz_pair =
    sigmoid(-z_pair). Why (docs/learning.md, "The history speaks only for block"): a
    session's earlier calls are evidence against a call (a secret read before a mail),
    hardly for it; with the raw term, every allowed mail after ordinary reads pushes the
    mail's factor towards "allow" along those reads, which wears down what it learned
    about secrets, and an allowed twin's history can outvote its call. Bounded, the term
    stops learning from allowed calls once it is silent for them. Then:

    `veto` = 0: z = z_lin + p, the sum (dz/dz_lin = dz/dp = 1).
    `veto` = c > 0: the noisy-OR of two reasons to block,
    sigmoid(z) = sigmoid(a) sigmoid(b), a = z_lin (the call judged on its own), b = c +
    p (its history: c is how sure an unremarkable history is of "allow"), so
    z = log sigmoid(a) + log sigmoid(b) - log(1 - sigmoid(a) sigmoid(b)),
    dz/da = sigmoid(-a) / (1 - q) and dz/db = sigmoid(-b) / (1 - q), q = sigmoid(a)
    sigmoid(b). Why (docs/learning.md, "The history as a veto"): with a sum, a block the
    history explains also pulls down the call's own logit, which the next allowed call of
    the same kind pushes back up, so the level both history twins are judged at swings;
    under the noisy-OR an allowed call teaches each factor "allow" on its own, and a block
    goes to the factor least sure of "allow" (explaining away).
    Returns (z, dz/dz_lin, dz/dz_pair), computed in log space (stable for any logits)."""
    d_bound = 1.0
    if block_only:
        d_bound = xp.exp(-xp.logaddexp(0.0, z_pair))  # sigmoid(-z_pair)
        z_pair = _LOG2 - xp.logaddexp(0.0, -z_pair)  # log(2 sigmoid(z_pair))
    if not veto:
        return z_lin + z_pair, 1.0, d_bound  # the sum: no derivative arrays to build
    a, b = z_lin, veto + z_pair
    log_q = -(xp.logaddexp(0.0, -a) + xp.logaddexp(0.0, -b))  # log sigmoid(a) sigmoid(b)
    log_q = xp.minimum(log_q, -np.finfo(log_q.dtype).tiny)  # q < 1: 1 - q > 0 (any dtype)
    log_1mq = xp.log(-xp.expm1(log_q))
    return (log_q - log_1mq, xp.exp(-xp.logaddexp(0.0, a) - log_1mq),
            xp.exp(-xp.logaddexp(0.0, b) - log_1mq) * d_bound)


def familiar_values(w_rows, val, ngram_end, power: float, ngram_start: int = 1, xp=np):
    """The wide features' values as one member's linear logit reads them with
    `ModelConfig.wide_familiarity` = `power` > 0: each row's byte n-grams (entries
    `ngram_start` <= k < `ngram_end[b]`: `wide_features` puts them first, after the bias)
    times f ** power, every other entry as it is, where

        f = sum_{k n-gram, w_k != 0} val_k^2 / sum_{k n-gram} val_k^2   (1 without n-grams)

    and w_k = `w_rows` [B, K], the member's weights at the row's buckets. A weight is 0
    until the wide learner first steps it (the table starts at zero and only the learner
    writes it), so f is the share of the call's n-gram mass the member has learned.

    Why (docs/learning.md, "A familiarity-scaled n-gram part"): in the first hundreds of
    signals the rare blocks push their n-grams, and every n-gram of the allowed traffic
    they share, toward "block"; a call built of values the stream never showed shares
    little more than those with what was learned, and its n-gram part then outweighed the
    shapes, places and known names that knew it. Scaled, an unfamiliar call is judged by
    the features that generalise; a familiar one (f ~ 1) as before.

    f is piecewise constant in w (it moves only when a weight leaves or reaches 0), so
    d logit / d w_k = f ** power * val_k for an n-gram entry, exactly, wherever the logit
    is differentiable: the model's backward uses the returned values as they are."""
    if not power:
        return val
    pos = xp.arange(val.shape[1])[None, :]
    ngram = (pos >= ngram_start) & (pos < xp.asarray(ngram_end)[:, None])
    mass = xp.where(ngram, val * val, 0.0)
    total = mass.sum(axis=1)
    seen = xp.where(w_rows != 0, mass, 0.0).sum(axis=1)
    f = xp.where(total > 0, seen / xp.where(total > 0, total, 1.0), 1.0)
    return xp.where(ngram, val * (f ** power)[:, None], val)


def novel_values(w_rows, val, novel_at, xp=np):
    """The wide features' values with each row's first-seen destination mark
    (`ModelConfig.wide_novel_destinations`, engine/wide.py ``d|novel``) read only where the
    member has not learned the row's destination: the mark sits right after the domain
    key, at `novel_at[b]` + 1 (`NOVEL_AT`; -1: the row has no destination), and reads 0
    once the member's weight at that domain key, `w_rows[b, novel_at[b]]`, is not 0. As
    in `familiar_values`, a weight is 0 until the wide learner first steps it, so "not
    learned" needs no state beyond the weights that serve.

    Why (docs/learning.md, "A first-seen destination"): a policy that allows a few
    domains and blocks the rest blocks every host no signal named before; the domain key
    of such a host is 0 and its n-grams, read by their familiarity, say little, so the
    outside hosts' first blocks after the change taught nothing an unseen one shares. The
    mark learns "a destination never learned before" from the first sight of each.

    The read is piecewise constant in w (it moves only when the domain key's weight
    leaves 0), so d logit / d w at the mark is its value as read, exactly, wherever the
    logit is differentiable: the backward uses the returned values as they are."""
    at = xp.asarray(novel_at)
    rows = at >= 0
    col = xp.where(rows, at, 0)
    seen = xp.take_along_axis(w_rows, col[:, None], axis=1)[:, 0] != 0
    mark = (xp.arange(val.shape[1])[None, :] == (col + 1)[:, None]) & (rows & seen)[:, None]
    return xp.where(mark, 0.0, val)


def read_values(w_rows, val, feats: dict, familiarity: tuple[float, int], xp=np):
    """A member's feature values as its linear logit reads them for `feats` (a batch's
    wide features): the n-grams by their familiarity when the batch says where they end
    (`familiar_values`), the first-seen destination mark by the member's domain keys when
    it says where they sit (`novel_values`); as they are otherwise."""
    if NGRAM_END in feats:
        val = familiar_values(w_rows, val, feats[NGRAM_END], *familiarity, xp=xp)
    if NOVEL_AT in feats:
        val = novel_values(w_rows, val, feats[NOVEL_AT], xp)
    return val


def familiarity_of(cfg) -> tuple[float, int]:
    """(power, where the n-grams start) of `familiar_values` for a model config: the
    n-grams come right after the bias feature, when there is one (`wide_features`)."""
    return cfg.wide_familiarity, int(cfg.wide_bias != 0)


def wide_table(params: dict, name: str):
    """The wide table `name` as rows to gather: ``wide.w`` is stored [members, buckets]
    (one logit's weights per member of the bag) and gathered flat, the pair term's tables
    [members * rows, rank]; member m's rows start at `member_offsets`' m-th entry."""
    return params[name].reshape(-1) if name == "wide.w" else params[name]


def member_offsets(cfg) -> list[tuple[int, int, int]]:
    """Where each member of the wide path's bag (`ModelConfig.wide_members`) starts in the
    tables `wide_table` gathers from: (``wide.w`` flat, ``wide.pair_call`` rows,
    ``wide.pair_hist`` rows); member 0 at (0, 0, 0), the layout of a path without a bag."""
    return [(m * cfg.wide_buckets, m * cfg.pair_call_rows, m * cfg.wide_pair_buckets)
            for m in range(cfg.wide_members)]


def shifted(idx, offset: int):
    """Bucket ids `idx` moved to a member's rows (`member_offsets`); member 0's as they are."""
    return idx if offset == 0 else idx + offset


def wide_logit_host(take, feats: dict, scale: float, pool: float = 0.0,
                    veto: float = 0.0, block_only: bool = False,
                    offsets: Sequence[tuple[int, int, int]] = ((0, 0, 0),),
                    familiarity: tuple[float, int] = (0.0, 1)) -> np.ndarray:
    """The wide path's logit [B] in float64 on the host: scale * the mean over the bag's
    members (`offsets`, `member_offsets`) of `veto_combine`(sum_k val_k w[idx_k],
    pair_logit pooled by `pool`, `veto`, `block_only`), the values read by `read_values`
    (familiarity = (power, n-gram start)). `take(name, idx)` returns the rows of the wide
    table `name` (as `wide_table` lays it out) at `idx` as host float64 (the model
    gathers on its backend and copies only those; the inference plan reads its own
    copies), `feats` the batch's wide features as host arrays."""
    total = 0.0
    for o_w, o_c, o_h in offsets:
        w = take("wide.w", shifted(feats["wide_idx"], o_w))
        val = read_values(w, feats["wide_val"], feats, familiarity)
        z = (w * val).sum(axis=1)
        if PAIR_KEYS[0] in feats:
            c_idx, c_val, h_idx, h_val, h_grp = (feats[k] for k in PAIR_KEYS)
            z = veto_combine(z, pair_logit(take("wide.pair_call", shifted(c_idx, o_c)), c_val,
                                           take("wide.pair_hist", shifted(h_idx, o_h)), h_val,
                                           pool, np, h_grp)[0], veto, np, block_only)[0]
        total = total + z
    return scale * total / len(offsets)


