"""The wide path's own optimiser: online AdaGrad on its weights, one signal at a time.

Why not AdamW with the transformer (docs/learning.md, "The wide path"): the wide half of
Wide & Deep must learn from the first signals on, as the anchor does, so every fresh
signal steps it as it is read, by AdaGrad per bucket, with the transformer's logit held
fixed (block-coordinate descent on one loss). Its features and its logit are in wide.py;
this learner computes the same logit (the pair term pooled alike, `veto_combine` alike),
so what it trains is what serves -- but for the n-grams' familiarity
(`ModelConfig.wide_familiarity`): serving reads them scaled by it, this learner steps on
them as they are, and its `logit` reads them as serving does when told where they end.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import numpy as np

from .layout import views
from .wide_logit import (
    familiar_values,
    familiarity_of,
    member_offsets,
    pair_logit,
    veto_combine,
)
from .wide_window import ContradictionWindow

#: `WideAdaGrad.learn`'s doubt when there is none: (factor 1, no threshold).
NO_DOUBT = (1.0, 0.0)


class WideAdaGrad(ContradictionWindow):
    """Online AdaGrad on the wide path's weights, one signal at a time.

    For a signal with sparse features (idx, val), pair features (c, cv, h, hv, entry), the rest
    of the gate's logit `z_rest` (the transformer's, held fixed), label y and weight w_i:

        z = z_rest + scale * z_wide, z_wide, d_lin, d_pair = veto_combine(sum_k val_k
            W[idx_k], z_pair, veto, block_only) (the sum when veto = 0: d_lin = 1, and
            d_pair = 1 unless the pair term is bounded, `block_only`),
            z_pair, u, v_eff, hw = pair_logit(U[c], cv, V[h], hv, pool, hist_grp=entry)
        dz = w_i (sigmoid(z) - y)
        dL/dW[j] = dz * scale * d_lin * sum_{k: idx_k = j} val_k  (+ l2 W[j])
        dL/dU[c] = dz * scale * d_pair * cv_c v_eff (+ l2 U[c]);  dL/dV[h] = dz * scale *
        d_pair * hw_h u (+ l2 V[h]); with pool 0, v_eff = v = sum_k hv_k V[h_k], hw = hv
        G += g^2;   theta -= lr g / (sqrt(G) + eps)     (per coordinate; `pair_lr` for U, V)

    The weights and the sums are views (the wide slots of the model's flat buffer and of
    AdamW's `v`, which AdamW leaves alone, `for_model`), so a checkpoint carries both.
    """

    def __init__(self, weights, accum, *, scale: float, lr: float = 0.5, l2: float = 1e-5,
                 eps: float = 1e-8, xp=np, pair=None, pair_lr: float = 0.1,
                 pool: float = 0.0, veto: float = 0.0, pair_l2: float | None = None,
                 pair_first: bool = False, block_only: bool = False,
                 destination_rows: int = 0, familiarity: tuple[float, int] = (0.0, 1),
                 rule_blocks_pair_only: bool = False) -> None:
        self.w, self.g2, self.scale, self.xp = weights, accum, scale, xp
        #: how `logit` reads the n-grams when told where they end (`familiar_values`:
        #: power, where they start); learning reads them as they are
        self.familiarity = familiarity
        self.lr, self.l2, self.eps = lr, l2, eps
        #: the pair tables' own L2 (None: `l2`)
        self.pair_l2 = pair_l2
        #: (U, sums of U, V, sums of V) of the call x history pair term, or None; its
        #: history keys pooled by `pool` (`pair_logit`)
        self.pair, self.pair_lr, self.pool = pair, pair_lr, pool
        #: the pair term combined with the linear logit as a veto (`veto_combine`), or summed
        self.veto = veto
        #: the pair term bounded to speak only for "block" (`veto_combine`)
        self.block_only = block_only
        #: `learn` steps the pair term first and the linear weights on what is left (below)
        self.pair_first = pair_first
        #: the call side's rows from here on are the destination keys' (engine/wide.py
        #: `destination_row`), which a first look's "block" does not step (`learn`)
        self.destination_from = (None if pair is None or not destination_rows
                                 else pair[0].shape[0] - destination_rows)
        #: a "block" of a call the history rule could concern steps the pair term alone
        #: (`learn`)
        self.rule_blocks_pair_only = rule_blocks_pair_only
        self._close_window()

    @classmethod
    def for_model(cls, model, accum_flat, **kw) -> WideAdaGrad | WideBag:
        """The wide path's optimiser over `model`'s wide slots, its sums in the same slots
        of `accum_flat` (AdamW's `v`: a flat buffer with the model's layout): one learner,
        or with `ModelConfig.wide_members` > 1 a `WideBag` of one learner per member, each
        over its member's rows (views)."""
        acc, cfg, P = views(accum_flat, model.layout), model.cfg, model.params
        learners = []
        for m, (_, o_c, o_h) in enumerate(member_offsets(cfg)):
            pair = None
            if "wide.pair_call" in acc:
                rc = slice(o_c, o_c + cfg.pair_call_rows)
                rh = slice(o_h, o_h + cfg.wide_pair_buckets)
                pair = (P["wide.pair_call"][rc], acc["wide.pair_call"][rc],
                        P["wide.pair_hist"][rh], acc["wide.pair_hist"][rh])
            learners.append(cls(P["wide.w"][m], acc["wide.w"][m], scale=cfg.wide_scale,
                                xp=model.ops.xp, pair=pair, pool=cfg.wide_pair_pool,
                                veto=cfg.wide_pair_veto if pair is not None else 0.0,
                                block_only=cfg.wide_pair_block_only and pair is not None,
                                destination_rows=cfg.pair_destination_rows,
                                familiarity=familiarity_of(cfg), **kw))
        return learners[0] if len(learners) == 1 else WideBag(learners)

    def logit(self, idx: np.ndarray, val: np.ndarray, z_rest: float, pair=None,
              ngram_end: int | None = None, novel_at: int = -1) -> float:
        """The gate's logit z_rest + scale * z_wide of one signal (no update); given where
        its byte n-grams end (`NGRAM_END`), read as the model reads them for a decision
        (`familiar_values` at `familiarity`); the first-seen destination mark after the
        domain key at `novel_at` (`NOVEL_AT`; -1: none) as `novel_values` reads it, in
        learning too."""
        if ngram_end is not None and self.familiarity[0]:
            w = self._host(self.w[self.xp.asarray(idx)]).astype(np.float64)
            val = familiar_values(w[None], np.asarray(val, np.float64)[None],
                                  np.array([ngram_end]), *self.familiarity)[0]
        return self._gradient(idx, val, z_rest, 1.0, 1.0, pair, novel_at)["z"]

    def gradient(self, idx: np.ndarray, val: np.ndarray, z_rest: float, label: float,
                 weight: float, pair=None) -> tuple[np.ndarray, np.ndarray, float]:
        """(unique buckets, dL/dW at them, logit z) of one signal's weighted BCE
        L = weight * (max(z, 0) - z y + log(1 + exp(-|z|))) (+ l2/2 ||W_touched||^2)."""
        st = self._gradient(idx, val, z_rest, label, weight, pair)
        return st["idx"], st["g"], st["z"]

    def pair_gradient(self, idx, val, z_rest: float, label: float, weight: float, pair
                      ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """((call rows, dL/dU at them [n, rank]), (history rows, dL/dV at them)) of the
        same loss as `gradient` (+ l2/2 of the touched rows)."""
        st = self._gradient(idx, val, z_rest, label, weight, pair)
        return st["pair"][0][:2], st["pair"][1][:2]

    def learn(self, idx: np.ndarray, val: np.ndarray, z_rest: float, label: float,
              weight: float, pair=None, pair_hold: float = 0.0,
              doubt: tuple[float, float] = NO_DOUBT, novel_at: int = -1) -> float:
        """One AdaGrad update from one signal; returns its logit before the update.
        `novel_at`: where the signal's domain key sits, its first-seen mark after it
        (`novel_values`: the mark steps only while the key is unlearned), or -1.

        Both parts step on the same gradient, or, with `pair_first`, the pair term steps
        first and the linear weights then on the gradient at the new pair term (one block
        coordinate step each, each exact for its block). Why: a history rule is a
        conjunction the pair term alone can carry, while the call's own words can only
        memorise "this call was blocked"; stepped together, a burst of exfiltrations from
        one session pushes the outbound call's words to block as fast as the pair term
        learns the read, and the same call after a harmless history is blocked with them
        (docs/learning.md, "The pair term first").

        `pair_hold` > 0: an "allow" label the pair term contradicts -- its part of the
        wide logit says "block" by more than `pair_hold` -- steps the linear weights only;
        the pair term is left as it is. Why (docs/learning.md, "The pair term holds"): the
        term is a conjunction learned from a few dozen exfiltrations, shared by every call
        site and every secret; one wrong "allow" from the gate on an exfiltration (6% of
        its decisions) costs it a full step, which its correction, at a logit already
        saying "block", gives back only a sliver of. The caller holds a signal's first
        look and lets its second look (online/second_look.py), under the newest label of
        its call, teach the term: by then the gate's mistakes are mostly corrected.

        A first look's "block" (`pair_hold` > 0, weight <= 1) does not step the destination
        keys' rows (`destination_rows`): a destination learns only "not the history rule,
        here" -- from allows, and from the corrections and second looks that take back
        what a wrong "allow" of the gate taught it. Why: an outside host's row that
        stepped on every exfiltration to it took a share of the rule, so a host it had
        not seen got less of it (docs/learning.md, "The destination's own rows").

        `doubt` = (factor, logits), logits > 0: an "allow" label the pair term contradicts
        by more than `logits` steps at `factor` times `weight`, both parts. The caller
        passes it for a second look whose label is still the gate's own (no correction
        came in 200 signals). Why: against a term that sure, about one such look in four
        was measured to be a gate mistake nobody corrected (~1.2% of all labels, so 20
        times as likely there), and one of them, on an exfiltration by e-mail, taught the
        term "allow" for every secret; the other three (a GET, an org host after a secret
        read) learn at the reduced weight (docs/learning.md, "Doubting an uncorrected
        allow").

        `rule_blocks_pair_only`: a "block" label of a call the history rule could concern
        -- its pair features hold a destination row (`destination_from`), which
        `pair_features` gives only to a call that can carry data out after a
        credential-file read -- steps the pair term alone; the linear weights do not
        learn it. Why (docs/learning.md, "The history rule's blocks are the pair
        term's"): the call's own words can only learn "this upload is blocked", and the
        same upload after a harmless read (its allowed twin) was then blocked by them
        (seed 16's history rule 0.75 / 0.86 at its first two checkpoints); the pair
        term, left the whole residual, learns the conjunction from fewer examples."""
        val = self._novel_read(idx, val, novel_at)  # before any step of this signal
        linear = not self._rule_block(pair, label)
        st = self._gradient(idx, val, z_rest, label, weight, pair)
        factor, logits = doubt
        if self._contradicted_allow(st, label, logits):
            weight *= factor
            st = self._gradient(idx, val, z_rest, label, weight, pair)
        if self.contra_left > 0 and self._relax_if_contradicted(st, label):
            st = self._gradient(idx, val, z_rest, label, weight, pair)  # at the decayed weights
        if self._contradicted_allow(st, label, pair_hold):
            st["pair"] = []  # held: the linear weights step alone, on the same gradient
        elif (st["pair"] and self.destination_from is not None and label < 0.5
              and weight <= 1.0 and pair_hold > 0):
            rows, g, now = st["pair"][0]
            keep = rows < self.destination_from
            st["pair"][0] = (rows[keep], g[keep], now[keep])
        if linear and not (self.pair_first and st["pair"]):
            self._step(self.w, self.g2, st["d_idx"], st["w_now"], st["g"], self.lr)
        if st["pair"]:  # only when the learner has a pair term and the signal its features
            for (rows, g, now), table, sums in zip(st["pair"], self.pair[0::2], self.pair[1::2],
                                                   strict=True):
                if len(rows):
                    self._step(table, sums, self.xp.asarray(rows), now, g, self.pair_lr)
            if self.pair_first and linear:
                lin = self._gradient(idx, val, z_rest, label, weight, pair)
                self._step(self.w, self.g2, lin["d_idx"], lin["w_now"], lin["g"], self.lr)
        return st["z"]

    def _rule_block(self, pair, label: float) -> bool:
        """A "block" label of a call whose pair features hold a destination row (the
        history rule's shape: an upload after a credential-file read), with
        `rule_blocks_pair_only` on: the pair term learns it alone (`learn`)."""
        return (self.rule_blocks_pair_only and label < 0.5 and pair is not None
                and self.destination_from is not None
                and bool((np.asarray(pair[0]) >= self.destination_from).any()))

    @staticmethod
    def _contradicted_allow(st: dict, label: float, logits: float) -> bool:
        """An "allow" label whose pair term (in `st`, from `_gradient`) says "block" by more
        than `logits`; never with `logits` 0 (the hold's and the doubt's "off")."""
        return logits > 0 and label >= 0.5 and st["z_pair"] < -logits

    def _step(self, table, sums, d_idx, now, g, lr) -> None:
        g2 = self._host(sums[d_idx]).astype(np.float64) + g * g
        sums[d_idx] = self.xp.asarray(g2, dtype=sums.dtype)
        table[d_idx] = self.xp.asarray(now - lr * g / (np.sqrt(g2) + self.eps),
                                       dtype=table.dtype)

    def _novel_read(self, idx, val, novel_at: int):
        """`val` with the first-seen destination mark (at `novel_at` + 1) read as
        `novel_values` reads it for this learner: 0 once its weight at the domain key (at
        `novel_at`) is not 0; `val` as it is without one (`novel_at` < 0)."""
        if novel_at < 0 or not self._host(self.w[int(np.asarray(idx)[novel_at])]):
            return val
        val = np.array(val, np.float64)
        val[novel_at + 1] = 0.0
        return val

    def _gradient(self, idx, val, z_rest, label, weight, pair, novel_at: int = -1) -> dict:
        """Everything an update needs, each touched weight read once (host, float64): the
        unique buckets, their weights and gradient, the logit, and per pair side
        (unique rows, gradient, rows now). The pair term is computed by `pair_logit` over
        the signal's keys as the model sees them (a bucket two keys share counts twice,
        as in the model's forward), its gradient then summed per unique row. The values
        are read with the first-seen mark after `novel_at` first (`_novel_read`)."""
        idx, val = _unique_sum(idx, self._novel_read(idx, val, novel_at))
        d_idx = self.xp.asarray(idx)
        w_now = self._host(self.w[d_idx]).astype(np.float64)
        z_lin = float(w_now @ val)
        sides, z_pair = [], 0.0
        if self.pair is not None and pair is not None:
            for table, (rows, vals) in ((self.pair[0], pair[:2]), (self.pair[2], pair[2:4])):
                rows, vals = np.asarray(rows), np.asarray(vals, np.float64)
                keep = vals != 0  # padding
                rows, vals = rows[keep], vals[keep]
                uniq, inv = np.unique(rows, return_inverse=True)
                now = self._host(table[self.xp.asarray(uniq)]).astype(np.float64)
                sides.append((uniq, inv, vals, now))
            (_, c_inv, c_val, c_now), (_, h_inv, h_val, h_now) = sides
            # each kept history key's entry (`keep` is the history side's, from the loop)
            h_grp = np.asarray(pair[4])[keep] if len(pair) > 4 else np.arange(len(h_val))
            if len(c_val) and len(h_val):
                zp, u, v_eff, hw = pair_logit(c_now[c_inv][None], c_val[None],
                                              h_now[h_inv][None], h_val[None], self.pool,
                                              np, h_grp[None])
                z_pair = float(zp[0])
            else:  # a side without keys: no term (its rows' gradient is the L2 alone)
                rank = c_now.shape[1]
                u, v_eff, hw = np.zeros((1, rank)), np.zeros((1, rank)), np.zeros((1, len(h_val)))
        z_wide, d_lin, d_pair = (float(t) for t in veto_combine(
            np.float64(z_lin), np.float64(z_pair), self.veto if sides else 0.0, np,
            self.block_only and bool(sides)))
        z = z_rest + self.scale * z_wide
        dz = weight * (0.5 * (1.0 + np.tanh(0.5 * z)) - label)
        out = {"idx": idx, "d_idx": d_idx, "w_now": w_now, "z": z,
               "z_pair": z_wide - z_lin,  # the pair term's part of the wide logit
               "g": self.scale * dz * d_lin * val + self.l2 * w_now, "pair": [],
               "val": val}
        if sides:
            # per key: dz_pair/dU[c_k] = cv_k v_eff, dz_pair/dV[h_k] = hw_k u; summed per row
            for (uniq, inv, _, now), coef, other in ((sides[0], c_val, v_eff[0]),
                                                      (sides[1], hw[0], u[0])):
                per_row = np.bincount(inv, weights=coef, minlength=len(uniq))
                g = (self.scale * dz * d_pair * per_row[:, None] * other[None, :]
                     + (self.l2 if self.pair_l2 is None else self.pair_l2) * now)
                out["pair"].append((uniq, g, now))
        return out

    @staticmethod
    def _host(a) -> np.ndarray:
        return a.get() if hasattr(a, "get") else np.asarray(a)

    def learn_all_for(self, examples: int) -> None:
        """Nothing to do: one learner learns every example already (`WideBag.learn_all_for`
        is what a drift alarm changes)."""

    def shrink(self, factor: float):
        """Scale the linear weights (the bias among them) by `factor`; the pair term's
        stay. Every logit's linear part keeps its sign and only its size changes, so the
        old policy's confident weights turn after fewer of a new policy's examples (a
        drift alarm calls it: `train.drift_wide_shrink`, docs/learning.md "Shrinking the
        wide path at a drift alarm"). Returns the weights before, for `unshrink`."""
        before = self.w.copy()
        self.w[...] *= factor
        return before

    def unshrink(self, before, factor: float) -> None:
        """Take back `shrink(factor)` (`before`: what it returned) and keep what was learned
        since: w = factor * before + learned, so adding (1 - factor) * before leaves
        before + learned (a withdrawn drift alarm)."""
        self.w[...] += (1.0 - factor) * before

    def relax(self, factor: float, pair_factor: float | None = None) -> None:
        """Scale the squared-gradient sums by `factor` (0 = forget them), the pair term's
        by `pair_factor` (default: `factor`): after a policy change AdaGrad's steps have
        shrunk with everything it has seen; relaxing them lets the wide path move as fast
        as at the start."""
        self.g2 *= factor
        if self.pair is not None:
            pair_factor = factor if pair_factor is None else pair_factor
            self.pair[1][...] *= pair_factor
            self.pair[3][...] *= pair_factor


class WideBag:
    """The wide path as an online bag (`ModelConfig.wide_members`; Oza and Russell's online
    bagging, River's `BaggingClassifier`): one `WideAdaGrad` per member, each on its own
    rows of the wide tables. The first member learns every signal at its weight, as a
    single learner would; member m > 0 learns it at k times its weight, k drawn from
    Poisson(1) by the member's own generator (k = 0: the member skips it). The logit is
    the members' mean, as the model's forward computes it (engine/model.py `gate_logit`).

    Why (docs/learning.md, "The wide path as a bag"): one learner's verdict on a whole
    category swung with single steps -- a weight-4 correction of a rightful e-mail moved
    the history rule's block members by +2.8 logits ("Seed 3's dip, step by step") -- and
    an average of the weights lagged what the rare blocks taught. Members that did not
    draw such a step, or drew it twice, average the swing without a lag. The draws are
    not part of a checkpoint: after a restart each member draws afresh (any draw is as
    good as another; only their independence matters)."""

    #: the members' generators: seed `SEED` + m for member m
    SEED = 7919

    def __init__(self, learners: list[WideAdaGrad]) -> None:
        self.learners = learners
        self._draws = [np.random.default_rng(self.SEED + m) for m in range(1, len(learners))]
        #: examples left that every member learns at least once (`learn_all_for`)
        self.all_learn_left = 0

    # the settings a reload changes (daemon/trainer/wide_path.py), on every member
    def _set(self, name: str, value) -> None:
        for learner in self.learners:
            setattr(learner, name, value)

    lr = property(lambda self: self.learners[0].lr, lambda self, v: self._set("lr", v))
    l2 = property(lambda self: self.learners[0].l2, lambda self, v: self._set("l2", v))
    pair_lr = property(lambda self: self.learners[0].pair_lr,
                       lambda self, v: self._set("pair_lr", v))
    pair_first = property(lambda self: self.learners[0].pair_first,
                          lambda self, v: self._set("pair_first", v))
    rule_blocks_pair_only = property(lambda self: self.learners[0].rule_blocks_pair_only,
                                     lambda self, v: self._set("rule_blocks_pair_only", v))
    #: the contradiction window's examples left (member 0's: it learns every example)
    contra_left = property(lambda self: self.learners[0].contra_left)

    def in_window_first(self, n: int) -> bool:
        """`WideAdaGrad.in_window_first` of member 0 (it learns every example)."""
        return self.learners[0].in_window_first(n)

    def learn_all_for(self, examples: int) -> None:
        """After a drift alarm: the next `examples` learned (signals, their second looks,
        replays) are learned by every member at least once (a draw of 0 counts as 1).
        Why: a member that draws 0 for the new policy's first signals holds the bag's mean
        on the old policy -- the bag of 4 made 225 errors in the 250 signals after a change
        where one learner made 194 (the harness, six seeds); with every member learning
        the next 500 examples, 205, and no checkpoint count lower (docs/learning.md
        "Every member learns after a drift alarm"). The members keep what they already
        differ in, and their generators draw as always. Not checkpointed, as the draws
        are not: a restart inside the window ends it."""
        self.all_learn_left = max(0, int(examples))

    def _times(self, weight: float) -> list[float]:
        """How many times each member learns a signal of `weight`: member 0 once, member
        m > 0 a Poisson(1) draw of its own generator, at least once while `learn_all_for`
        lasts (bench_wide_experiments.py replaces this to measure other draws)."""
        times = [1.0] + [float(draw.poisson(1.0)) for draw in self._draws]
        if self.all_learn_left > 0:
            self.all_learn_left -= 1
            times = [max(k, 1.0) for k in times]
        return times

    def learn(self, idx: np.ndarray, val: np.ndarray, z_rest: float, label: float,
              weight: float, pair=None, pair_hold: float = 0.0,
              doubt: tuple[float, float] = NO_DOUBT, novel_at: int = -1) -> float:
        """Each member's `WideAdaGrad.learn` at its drawn multiple of `weight` (each member
        judges the hold and the doubt by its own pair term, the first-seen mark by its own
        domain key); returns the bag's logit before the update."""
        z = 0.0
        for learner, k in zip(self.learners, self._times(weight), strict=True):
            z += (learner.learn(idx, val, z_rest, label, weight * k, pair, pair_hold, doubt,
                                novel_at)
                  if k else learner.logit(idx, val, z_rest, pair, novel_at=novel_at))
        return z / len(self.learners)

    def logit(self, idx: np.ndarray, val: np.ndarray, z_rest: float, pair=None,
              ngram_end: int | None = None, novel_at: int = -1) -> float:
        """The bag's logit: the members' mean (no update)."""
        return sum(learner.logit(idx, val, z_rest, pair, ngram_end, novel_at)
                   for learner in self.learners) / len(self.learners)

    def shrink(self, factor: float) -> list:
        """`WideAdaGrad.shrink` on every member (their weights before, for `unshrink`)."""
        return [learner.shrink(factor) for learner in self.learners]

    def unshrink(self, before: list, factor: float) -> None:
        """`WideAdaGrad.unshrink` on every member."""
        for learner, b in zip(self.learners, before, strict=True):
            learner.unshrink(b, factor)

    def relax_contradicted(self, factor: float, examples: int, margin: float,
                           decay: float = 1.0, votes: int = 1) -> None:
        """`WideAdaGrad.relax_contradicted` on every member (each judges by its own logit)."""
        for learner in self.learners:
            learner.relax_contradicted(factor, examples, margin, decay, votes)

    def restore_window(self) -> bool:
        """`WideAdaGrad.restore_window` on every member."""
        return any([learner.restore_window() for learner in self.learners])

    @contextlib.contextmanager
    def alarm_evidence(self, evidence: Iterable[tuple] = ()) -> Iterator[None]:
        """`WideAdaGrad.alarm_evidence` on every member (each reads `evidence` at its own
        weights)."""
        evidence = list(evidence)
        with contextlib.ExitStack() as stack:
            for learner in self.learners:
                stack.enter_context(learner.alarm_evidence(evidence))
            yield

    def relax(self, factor: float, pair_factor: float | None = None) -> None:
        """`WideAdaGrad.relax` on every member."""
        for learner in self.learners:
            learner.relax(factor, pair_factor)


def _unique_sum(idx, val) -> tuple[np.ndarray, np.ndarray]:
    """(unique ids, summed values) of sparse (ids, values), zero values (padding) dropped."""
    val = np.asarray(val, np.float64)
    keep = val != 0
    idx, inv = np.unique(np.asarray(idx)[keep], return_inverse=True)
    return idx, np.bincount(inv, weights=val[keep], minlength=len(idx))
