"""The serving side: an immutable (version, weights) snapshot swapped by one reference.

Training never writes into a snapshot's weights: a swap builds a NEW snapshot from a copy
of the trained buffer and rebinds `Serving.current`. A prediction reads `current` once,
so it sees the old or the new weights, never a mix, and it never takes a lock the
trainer holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .engine import Model, ModelConfig, source_batch


@dataclass(frozen=True)
class Bands:
    """Confidence bands: allow (p >= allow), block (p <= block), ask in between."""

    allow: float = 0.9
    block: float = 0.1

    def of(self, p_allow: float) -> str:
        if p_allow >= self.allow:
            return "allow"
        if p_allow <= self.block:
            return "block"
        return "ask"


@dataclass(frozen=True)
class Calibration:
    """p_allow = sigmoid(a z + b) over the gate logit z: Platt scaling, fitted by the
    trainer on the progressive-validation stream (gated.online.calibration) and swapped
    in by one reference assignment, like the weights."""

    a: float = 1.0
    b: float = 0.0

    def __call__(self, z: np.ndarray) -> np.ndarray:
        return 0.5 * (1.0 + np.tanh(0.5 * (self.a * np.asarray(z, np.float64) + self.b)))


@dataclass(frozen=True)
class Snapshot:
    version: int
    step: int
    model: Model  # owns a private copy of the weights; never mutated after publication


class Serving:
    """Holds the current snapshot and answers predict / explain from it."""

    def __init__(self, cfg: ModelConfig, flat: np.ndarray, version: int, step: int,
                 backend: str = "numpy", bands: Bands | None = None) -> None:
        self.cfg, self.backend = cfg, backend
        self.bands = bands or Bands()
        self.calibration = Calibration()
        self.current = Snapshot(version, step, Model.from_flat(cfg, flat, backend=backend))

    def swap(self, flat, version: int, step: int) -> Snapshot:
        """Publish a copy of `flat` as the new snapshot: one reference assignment."""
        snap = Snapshot(version, step, Model.from_flat(self.cfg, flat, backend=self.backend))
        self.current = snap
        return snap

    def move_to(self, backend: str, flat=None) -> Snapshot:
        """Rebuild the current snapshot on `backend` (the GPU -> CPU fallback), same
        version and step. `flat` (host weights) replaces reading the current ones back,
        for when the device they are on no longer answers. Later swaps use `backend`."""
        snap = self.current
        if flat is None:
            flat = snap.model.ops.to_numpy(snap.model.flat)
        new = Snapshot(snap.version, snap.step, Model.from_flat(self.cfg, flat, backend=backend))
        self.backend = backend
        self.current = new
        return new

    def score_many(self, items: Sequence[tuple[str, Sequence[str] | None]]
                   ) -> tuple[np.ndarray, np.ndarray, Snapshot]:
        """(raw gate logits, calibrated p_allow, snapshot) for (context, history) pairs."""
        return self.score_sources(source_batch(items, self.cfg))

    def score_sources(self, sources: dict) -> tuple[np.ndarray, np.ndarray, Snapshot]:
        """`score_many` for a `source_batch` the caller already built."""
        snap, cal = self.current, self.calibration
        z = snap.model.predict_z(sources)
        return z, cal(z), snap

    def predict_many(self, items: Sequence[tuple[str, Sequence[str] | None]]
                     ) -> tuple[np.ndarray, Snapshot]:
        """Calibrated p_allow for (context, history) pairs, and the snapshot that served."""
        _, p, snap = self.score_many(items)
        return p, snap

    def predict(self, context: str, history: Sequence[str] | None = None) -> dict:
        p, snap = self.predict_many([(context, history)])
        return {"p_allow": float(p[0]), "band": self.bands.of(float(p[0])),
                "version": snap.version}

    def explain(self, context: str, history: Sequence[str] | None = None,
                max_len: int = 64) -> dict:
        snap, cal = self.current, self.calibration
        src = source_batch([(context, history)], self.cfg)
        p_raw, reason = snap.model.predict_and_decode(src, max_len=max_len)
        p = float(cal(np.log(p_raw) - np.log1p(-p_raw))) if 0.0 < p_raw < 1.0 else p_raw
        return {"p_allow": p, "band": self.bands.of(p), "reason": reason,
                "version": snap.version}
