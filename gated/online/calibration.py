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

    def fit(self, iters: int = 25) -> None:
        """Newton's method on the mean log-loss (+ a small ridge towards a=1, b=0)."""
        z, y = np.asarray(self.z), np.asarray(self.y)
        a, b = self.a, self.b
        n = len(z)
        for _ in range(iters):
            p = _sigmoid(a * z + b)
            r = p - y
            g = np.array([r @ z / n + self.l2 * (a - 1.0), r.sum() / n + self.l2 * b])
            w = p * (1.0 - p)
            h = np.array([[w @ (z * z) / n + self.l2, w @ z / n],
                          [w @ z / n, w.sum() / n + self.l2]])
            step = np.linalg.solve(h, g)
            a, b = a - step[0], b - step[1]
            if abs(step).max() < 1e-9:
                break
        if math.isfinite(a) and math.isfinite(b) and a > 0:  # never invert the gate
            self.a, self.b = float(a), float(b)
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
