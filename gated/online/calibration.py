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


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


class PlattCalibrator:
    """p_allow = sigmoid(a z + b); identity (a=1, b=0) until `min_samples` pairs exist."""

    def __init__(self, size: int = 2000, refit_every: int = 50, min_samples: int = 200,
                 l2: float = 1e-3) -> None:
        self.size, self.refit_every, self.min_samples, self.l2 = size, refit_every, min_samples, l2
        self.z: deque[float] = deque(maxlen=size)
        self.y: deque[float] = deque(maxlen=size)
        self.a, self.b = 1.0, 0.0
        self._since_fit = 0

    def __call__(self, z: np.ndarray | float) -> np.ndarray:
        return _sigmoid(self.a * np.asarray(z, dtype=np.float64) + self.b)

    @property
    def params(self) -> tuple[float, float]:
        return self.a, self.b

    def update(self, z: float, label: float) -> bool:
        """Record one progressive (logit, label) pair; refit when due. True if refitted."""
        if not math.isfinite(z):
            return False
        self.z.append(float(z))
        self.y.append(float(label))
        self._since_fit += 1
        if self._since_fit >= self.refit_every and len(self.z) >= self.min_samples:
            self.fit()
            return True
        return False

    def fit(self, iters: int = 50) -> None:
        """Damped Newton on the mean log-loss (+ a small ridge towards a=1, b=0): each
        step is halved until the loss falls, so it converges from any start."""
        z, y = np.asarray(self.z), np.asarray(self.y)
        theta = np.array([self.a, self.b])
        prior = np.array([1.0, 0.0])

        def loss(t: np.ndarray) -> float:
            u = t[0] * z + t[1]
            return float(np.mean(np.logaddexp(0.0, u) - y * u)
                         + 0.5 * self.l2 * np.sum((t - prior) ** 2))

        current = loss(theta)
        for _ in range(iters):
            p = _sigmoid(theta[0] * z + theta[1])
            r, w = p - y, p * (1.0 - p)
            g = np.array([np.mean(r * z), np.mean(r)]) + self.l2 * (theta - prior)
            h = np.array([[np.mean(w * z * z), np.mean(w * z)],
                          [np.mean(w * z), np.mean(w)]]) + self.l2 * np.eye(2)
            step = np.linalg.solve(h, g)
            t = 1.0
            while t > 1e-6 and loss(theta - t * step) > current:
                t *= 0.5
            if t <= 1e-6:
                break
            theta = theta - t * step
            current = loss(theta)
            if np.abs(t * step).max() < 1e-9:
                break
        a, b = float(theta[0]), float(theta[1])
        if math.isfinite(a) and math.isfinite(b) and a > 0:  # never invert the gate
            self.a, self.b = a, b
        self._since_fit = 0

    def state(self) -> dict:
        return {"a": self.a, "b": self.b, "z": list(self.z), "y": list(self.y)}

    def load(self, state: dict | None) -> None:
        if not state:
            return
        self.a, self.b = float(state["a"]), float(state["b"])
        self.z.extend(state.get("z", []))
        self.y.extend(state.get("y", []))


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
