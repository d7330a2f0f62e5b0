"""Calibration: Platt scaling fitted online on the progressive-validation stream.

The gate's raw probability is trained on weighted, class-imbalanced, selectively
back-propagated batches, so it need not mean what it says. `PlattCalibrator` keeps the
last `size` (logit, label) pairs that progressive validation produced -- each scored by
the serving model BEFORE it trained on that signal, so the fit is out-of-sample -- and
refits p = sigmoid(a z + b) by Newton's method every `refit_every` new pairs. Two
parameters, a few thousand points: exact and cheap. Bands use the calibrated value.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

#: (a, b) of the identity map, the ridge's centre and the fit a refit must beat.
_IDENTITY = np.array([1.0, 0.0])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


class PlattCalibrator:
    """p_allow = sigmoid(a z + b); identity (a=1, b=0) until `min_samples` pairs exist.

    500: a map fitted to the first few hundred pairs, while the model under it changes
    fastest, cost 2 points of accuracy at the first checkpoint of the learning benchmark.
    """

    def __init__(self, size: int = 2000, refit_every: int = 50, min_samples: int = 500,
                 l2: float = 1e-3) -> None:
        self.size, self.refit_every, self.min_samples, self.l2 = size, refit_every, min_samples, l2
        self.z: deque[float] = deque(maxlen=size)
        self.y: deque[float] = deque(maxlen=size)
        self.fp: deque[bytes | None] = deque(maxlen=size)
        self.a, self.b = 1.0, 0.0
        self._since_fit = 0

    def __call__(self, z: np.ndarray | float) -> np.ndarray:
        return _sigmoid(self.a * np.asarray(z, dtype=np.float64) + self.b)

    @property
    def params(self) -> tuple[float, float]:
        return self.a, self.b

    def update(self, z: float, label: float, fingerprint: bytes | None = None) -> bool:
        """Record one progressive (logit, label) pair; refit when due. True if refitted.

        `fingerprint` (the call's (context, history) fingerprint) lets a later correction
        relabel the pair (`relabel`)."""
        if not math.isfinite(z):
            return False
        self.z.append(float(z))
        self.y.append(float(label))
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

    def fit(self, iters: int = 50) -> None:
        """Refit, and keep the fit only if it earns its place: fitted on the older three
        quarters of the pairs, it must beat the identity (a=1, b=0) in log-loss on the
        newest quarter, else serving uses the raw probability. The model under it keeps
        changing, so a map fitted to yesterday's logits can be worse than none (measured:
        early in a stream it cost 2 points of accuracy); when it passes, it is refitted on
        every pair."""
        z, y = np.asarray(self.z), np.asarray(self.y)
        k = (3 * z.size) // 4
        trial = self._newton(z[:k], y[:k], np.array([self.a, self.b]), iters)
        if self._loss(trial, z[k:], y[k:]) < self._loss(_IDENTITY, z[k:], y[k:]):
            theta = self._newton(z, y, trial, iters)
        else:
            theta = _IDENTITY
        a, b = float(theta[0]), float(theta[1])
        if math.isfinite(a) and math.isfinite(b) and a > 0:  # never invert the gate
            self.a, self.b = a, b
        self._since_fit = 0

    def _loss(self, t: np.ndarray, z: np.ndarray, y: np.ndarray) -> float:
        """Mean log-loss of sigmoid(t0 z + t1) (+ a small ridge towards a=1, b=0)."""
        u = t[0] * z + t[1]
        return float(np.mean(np.logaddexp(0.0, u) - y * u)
                     + 0.5 * self.l2 * np.sum((t - _IDENTITY) ** 2))

    def _newton(self, z: np.ndarray, y: np.ndarray, theta: np.ndarray,
                iters: int) -> np.ndarray:
        """Damped Newton on `_loss`: each step is halved until the loss falls, so it
        converges from any start."""
        current = self._loss(theta, z, y)
        for _ in range(iters):
            p = _sigmoid(theta[0] * z + theta[1])
            r, w = p - y, p * (1.0 - p)
            g = np.array([np.mean(r * z), np.mean(r)]) + self.l2 * (theta - _IDENTITY)
            h = np.array([[np.mean(w * z * z), np.mean(w * z)],
                          [np.mean(w * z), np.mean(w)]]) + self.l2 * np.eye(2)
            step = np.linalg.solve(h, g)
            t = 1.0
            while t > 1e-6 and self._loss(theta - t * step, z, y) > current:
                t *= 0.5
            if t <= 1e-6:
                break
            theta = theta - t * step
            current = self._loss(theta, z, y)
            if np.abs(t * step).max() < 1e-9:
                break
        return theta

    def state(self) -> dict:
        return {"a": self.a, "b": self.b, "z": list(self.z), "y": list(self.y)}

    def load(self, state: dict | None) -> None:
        if not state:
            return
        self.a, self.b = float(state["a"]), float(state["b"])
        self.z.extend(state.get("z", []))
        self.y.extend(state.get("y", []))
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
