"""Calibration: Platt scaling fitted online on the progressive-validation stream.

The gate's raw probability is trained on weighted, class-imbalanced, selectively
back-propagated batches, so it need not mean what it says. `PlattCalibrator` keeps the
last `size` (logit, label) pairs that progressive validation produced -- each scored by
the serving model BEFORE it trained on that signal, so the fit is out-of-sample -- and
refits p = sigmoid(a z + b) by Newton's method every `refit_every` new pairs. Bands use
the calibrated value.

The map also weighs the transformer's part of the logit: p = sigmoid(a z + d z_deep + b),
with d in [-a, 0], so the served logit is a (z_wide + s z_deep) + b with the transformer's
share s = (a + d) / a in [0, 1] -- what its part earns on the same out-of-sample stream
(stacking). Why (measured, docs/learning.md "The transformer's share"): on a 2-core CPU
flint's transformer gets a few hundred steps in 12,000 signals; fitted freely, its
coefficient came out at -0.26..+0.37 around a ~0.5-0.9, i.e. its part added nothing on
the stream, while on calls with values never seen it swung the decision (unseen-value
probes 0.62-0.72 where the wide path alone had 0.84-0.89). A transformer that has learned
more (a GPU, a longer run) earns its share back -- clearly: a free share must beat the
prior share on the newest pairs by SHARE_EVIDENCE standard errors (`_earns_share`).
Three parameters, a few thousand points: exact and cheap.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

#: standard errors by which a free share's log-loss gain over the prior share must stand
#: out on the newest quarter of the pairs (`PlattCalibrator._earns_share`)
SHARE_EVIDENCE = 2.0


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def platt_map(z: np.ndarray | float, z_deep: np.ndarray | float, a: float, b: float,
              d: float) -> np.ndarray:
    """p_allow = sigmoid(a z + d z_deep + b): the map fitted here and the one serving
    applies (daemon/serving.py `Calibration`), in one place."""
    return _sigmoid(a * np.asarray(z, dtype=np.float64)
                    + d * np.asarray(z_deep, dtype=np.float64) + b)


class PlattCalibrator:
    """p_allow = sigmoid(a z + d z_deep + b); the prior map (a=1, b=0, d=share_prior-1)
    until `min_samples` pairs exist.

    500: a map fitted to the first few hundred pairs, while the model under it changes
    fastest, cost 2 points of accuracy at the first checkpoint of the learning benchmark.

    `burn_in`: the first `burn_in` pairs a fresh calibrator sees are not kept at all. Why
    (docs/learning.md, "The first calibration fit"): they were scored by a model that had
    seen almost nothing -- logits near 0 on calls that are mostly allowed -- so a fit on
    them learns the base rate as an intercept (b = +1.29, a = 0.45 at 500 signals, seed 5)
    and serves it to a model that has since learned: block recall on unseen values 0.22
    where the logits alone gave 0.94.

    `intercept_max`: the same happens later, more mildly: in the first few thousand
    signals the logits near 0 on the stream are mostly allowed calls the model has not yet
    learned to be sure of, so the fit's intercept comes out positive (+0.2..+0.4) and
    moves every call near 0 towards "allow" -- also the blocks with values never seen,
    whose logits are near 0 for the opposite reason (docs/learning.md, "Seed 4's dip at
    ~1,500: ..., the calibration's intercept at most 0"). With `intercept_max` 0 the map
    can only sharpen, soften or move decisions towards "block".
    """

    def __init__(self, size: int = 2000, refit_every: int = 50, min_samples: int = 500,
                 l2: float = 1e-3, share_prior: float = 1.0, burn_in: int = 0,
                 intercept_max: float = math.inf) -> None:
        self.size, self.refit_every, self.min_samples, self.l2 = size, refit_every, min_samples, l2
        #: the largest intercept b a fit may serve: the fit is the constrained optimum of
        #: the same loss (`_fit_bounded`). 0: the map never moves a decision towards
        #: "allow" (a logit below 0 stays a block); why: the class docstring's last part
        self.intercept_max = float(intercept_max)
        #: pairs not kept at the start, and how many pairs this calibrator has been offered
        self.burn_in, self.seen = burn_in, 0
        self.z: deque[float] = deque(maxlen=size)
        self.zd: deque[float] = deque(maxlen=size)  # the transformer's part of each z
        self.y: deque[float] = deque(maxlen=size)
        #: the weight each pair has in the fit when its label is "block" (1 when "allow")
        self.bw: deque[float] = deque(maxlen=size)
        self.fp: deque[bytes | None] = deque(maxlen=size)
        #: (a, b, d) before any fit: the ridge's centre and the map a refit must beat. With
        #: `share_prior` 0 (a gate with a wide path) the transformer starts with no share
        #: of the served logit and gets one when a fit shows it earns it
        self._prior = np.array([1.0, 0.0, share_prior - 1.0])
        self.a, self.b, self.d = (float(t) for t in self._prior)
        self._since_fit = 0

    def __call__(self, z: np.ndarray | float, z_deep: np.ndarray | float = 0.0) -> np.ndarray:
        return platt_map(z, z_deep, self.a, self.b, self.d)

    @property
    def params(self) -> tuple[float, float, float]:
        return self.a, self.b, self.d

    def update(self, z: float, label: float, fingerprint: bytes | None = None,
               z_deep: float = 0.0, block_weight: float = 1.0) -> bool:
        """Record one progressive (logit, label) pair and the transformer's part of that
        logit (0 without a wide path: then d stays 0); refit when due. True if refitted.

        `fingerprint` (the call's (context, history) fingerprint) lets a later correction
        relabel the pair (`relabel`). `block_weight`: the pair's weight in the fit while
        its label is "block" -- what the model's training gave a "block" of that signal
        (`train.wide_early_block_weight`), so that the map is fitted to the objective the
        logits were trained on and does not take back a class weight the trainer chose
        (docs/learning.md, "Blocks weigh more at first")."""
        if not (math.isfinite(z) and math.isfinite(z_deep)):
            return False
        self.seen += 1
        if self.seen <= self.burn_in:
            return False  # scored by a model that had barely begun (the class docstring)
        self.z.append(float(z))
        self.zd.append(float(z_deep))
        self.y.append(float(label))
        self.bw.append(float(block_weight) if math.isfinite(block_weight) else 1.0)
        self.fp.append(fingerprint)
        self._since_fit += 1
        if self._since_fit >= self.refit_every and len(self.z) >= self.min_samples:
            self.fit()
            return True
        return False

    def relabel(self, fingerprint: bytes, label: float) -> int:
        """A person corrected the gate on this call: its pairs get the corrected label, so
        the map is fitted to what the gate should have said, not to its noise (fitted to
        the noisy labels it shrank the logits towards the majority class and cost recall).
        Returns how many pairs changed."""
        changed = 0
        for i, f in enumerate(self.fp):
            if f == fingerprint and self.y[i] != label:
                self.y[i] = float(label)
                changed += 1
        return changed

    def pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The fit's data: rows [z, 1, z_deep], labels, and each pair's weight (its
        `block_weight` while labelled "block", 1 while "allow")."""
        x = np.column_stack([np.asarray(self.z), np.ones(len(self.z)), np.asarray(self.zd)])
        y = np.asarray(self.y)
        return x, y, np.where(y < 0.5, np.asarray(self.bw), 1.0)

    def fit(self, iters: int = 50) -> None:
        """Refit, and keep the fit only if it earns its place: fitted on the older three
        quarters of the pairs, it must beat the prior map (a=1, b=0, d=share_prior-1) in
        log-loss on the newest quarter, else serving uses the prior map. The model under it keeps
        changing, so a map fitted to yesterday's logits can be worse than none (measured:
        early in a stream it cost 2 points of accuracy); when it passes, it is refitted on
        every pair.

        The transformer's share moves from its prior only where it earns that too: the fit
        with the share free must beat the fit with the share held at the prior on the
        newest quarter by more than SHARE_EVIDENCE standard errors of the pairs' paired
        log-loss differences (`_earns_share`); else the map keeps the prior share and fits
        only a and b."""
        x, y, w = self.pairs()
        k = (3 * y.size) // 4
        b0 = min(self.b, self.intercept_max)
        free = self._fit_bounded(x[:k], y[:k], w[:k], np.array([self.a, b0, self.d]), iters)
        held = self._fit_held(x[:k], y[:k], w[:k], np.array([self.a, b0]), iters)
        earned = self._earns_share(free, held, x[k:], y[k:], w[k:])
        trial = free if earned else held
        if (self._loss(trial, x[k:], y[k:], w[k:])
                < self._loss(self._prior, x[k:], y[k:], w[k:])):
            theta = (self._fit_bounded(x, y, w, trial, iters) if earned
                     else self._fit_held(x, y, w, trial[:2], iters))
        else:
            theta = self._prior
        a, b, d = (float(t) for t in theta)
        if math.isfinite(a) and math.isfinite(b) and math.isfinite(d) and a > 0:
            self.a, self.b, self.d = a, b, d  # (a > 0: never invert the gate)
        self._since_fit = 0

    def _fit_bounded(self, x: np.ndarray, y: np.ndarray, w: np.ndarray, theta: np.ndarray,
                     iters: int) -> np.ndarray:
        """The fit with b <= `intercept_max`: the loss is convex, so when the free optimum
        has b above the bound the bounded one has b on it, and Newton over (a, d) with b
        held there finds it."""
        theta = self._clip(self._newton(x, y, w, theta, iters))
        if theta[1] > self.intercept_max:
            theta = np.array([theta[0], self.intercept_max, theta[2]])
            theta = self._clip(self._newton(x, y, w, theta, iters, free=(0, 2)))
        return theta

    def _earns_share(self, free: np.ndarray, held: np.ndarray, x: np.ndarray, y: np.ndarray,
                     w: np.ndarray) -> bool:
        """Does the fit with a free share (`free`) beat the one with the prior share
        (`held`) on these pairs by more than SHARE_EVIDENCE standard errors of its mean
        gain per pair (paired: the same pairs under both maps)?

        Why (docs/learning.md, "The share earns its place"): on flint's 2-core CPU the
        first fits, on ~500 pairs while the transformer had ~60 steps, gave it shares of
        0.4-0.75 whose gain on the newest quarter was 6 +- 16 milli-nats, the sign
        flipping fit to fit; at 0.75 (seed 1, 1,016 signals) it cost the unseen-value
        probes 0.958 -> 0.885 and the history rule 0.934 -> 0.828 of what the wide path
        alone answered."""
        if y.size < 2:
            return False
        gain = self._pair_losses(held, x, y, w) - self._pair_losses(free, x, y, w)
        gain = gain / np.mean(w)
        spread = float(np.std(gain, ddof=1))
        return bool(np.mean(gain) > SHARE_EVIDENCE * spread / math.sqrt(gain.size)
                    and np.mean(gain) > 0.0)

    @staticmethod
    def _pair_losses(t: np.ndarray, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Each pair's weighted log-loss under the map `t` (no ridge)."""
        u = x @ t
        return w * (np.logaddexp(0.0, u) - y * u)

    def _fit_held(self, x: np.ndarray, y: np.ndarray, w: np.ndarray, start: np.ndarray,
                  iters: int) -> np.ndarray:
        """The fit of a and b (b <= `intercept_max`) with the transformer's share held at
        its prior s0: the served logit a (z_wide + s0 z_deep) + b = a (z - (1 - s0) z_deep)
        + b, a Platt fit on that one column. Returned as (a, b, d) with d = -(1 - s0) a."""
        s0 = 1.0 + self._prior[2]
        xh = np.column_stack([x[:, 0] - (1.0 - s0) * x[:, 2], x[:, 1], np.zeros(len(x))])
        t = self._newton(xh, y, w, np.array([start[0], start[1], self._prior[2]]), iters,
                         free=(0, 1))
        if t[1] > self.intercept_max:
            t = self._newton(xh, y, w, np.array([t[0], self.intercept_max, self._prior[2]]),
                             iters, free=(0,))
        return np.array([t[0], t[1], -(1.0 - s0) * t[0]])

    @staticmethod
    def _clip(theta: np.ndarray) -> np.ndarray:
        """d into [-a, 0]: the transformer's share of the logit in [0, 1] (discounted,
        never amplified nor turned against its sign)."""
        a, b, d = theta
        return np.array([a, b, min(0.0, max(-abs(a), d))])

    def _loss(self, t: np.ndarray, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
        """Weighted mean log-loss of sigmoid(x @ t), x = [z, 1, z_deep], pair weights `w`
        (+ a small ridge towards the prior map)."""
        return float(np.sum(self._pair_losses(t, x, y, w)) / np.sum(w)
                     + 0.5 * self.l2 * np.sum((t - self._prior) ** 2))

    def _newton(self, x: np.ndarray, y: np.ndarray, w: np.ndarray, theta: np.ndarray,
                iters: int, free: tuple[int, ...] = (0, 1, 2)) -> np.ndarray:
        """Damped Newton on `_loss` over the parameters `free` (the others held where
        `theta` has them): each step is halved until the loss falls, so it converges from
        any start."""
        current = self._loss(theta, x, y, w)
        ridge = self.l2 * np.eye(len(free))
        total = np.sum(w)
        f = list(free)
        for _ in range(iters):
            p = _sigmoid(x @ theta)
            g = x.T @ (w * (p - y)) / total + self.l2 * (theta - self._prior)
            h = (x * (w * p * (1.0 - p))[:, None]).T @ x / total
            step = np.zeros_like(theta)
            step[f] = np.linalg.solve(h[np.ix_(f, f)] + ridge, g[f])
            t = 1.0
            while t > 1e-6 and self._loss(theta - t * step, x, y, w) > current:
                t *= 0.5
            if t <= 1e-6:
                break
            theta = theta - t * step
            current = self._loss(theta, x, y, w)
            if np.abs(t * step).max() < 1e-9:
                break
        return theta

    def state(self) -> dict:
        return {"a": self.a, "b": self.b, "d": self.d, "z": list(self.z),
                "zd": list(self.zd), "y": list(self.y), "bw": list(self.bw),
                "seen": self.seen}

    def load(self, state: dict | None) -> None:
        if not state:
            return
        self.a, self.b = float(state["a"]), float(state["b"])
        self.d = float(state.get("d", 0.0))  # a checkpoint from before the share: 0
        # a checkpoint from before the burn-in kept every pair it saw: past it
        self.seen = int(state.get("seen", self.burn_in))
        self.z.extend(state.get("z", []))
        self.zd.extend(state.get("zd", [0.0] * len(state.get("z", []))))
        self.y.extend(state.get("y", []))
        # a checkpoint from before the block weights: every pair at weight 1
        self.bw.extend(state.get("bw", [1.0] * len(state.get("z", []))))
        self.fp.extend([None] * (len(self.z) - len(self.fp)))  # not kept across restarts


def expected_calibration_error(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """ECE: sum over equal-width bins of |mean p - share of y=1| weighted by bin size."""
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if p.size == 0:
        return 0.0
    which = np.minimum((p * bins).astype(int), bins - 1)
    ece = 0.0
    for k in range(bins):
        sel = which == k
        if sel.any():
            ece += sel.mean() * abs(p[sel].mean() - y[sel].mean())
    return float(ece)


def brier_score(p: np.ndarray, y: np.ndarray) -> float:
    """Mean squared error of the probability against the 0/1 label."""
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    return float(np.mean((p - y) ** 2)) if p.size else 0.0
