"""A wide-only learner for the tests that ask what one wide feature group teaches: the
tiny model's wide path (its own features, `source_batch`, and its own AdaGrad), the
transformer's logit held at 0."""

from __future__ import annotations

import dataclasses

import numpy as np

from gated.daemon.trainer.wide_path import wide_row
from gated.engine.config import ModelConfig
from gated.engine.model import Model
from gated.engine.tokenizer import source_batch
from gated.engine.wide_learner import WideAdaGrad


class WideOnly:
    """`learn(context, history, label)` one signal at a time; `logit(context, history)`."""

    def __init__(self, **config: object) -> None:
        self.cfg = dataclasses.replace(ModelConfig.tiny(), wide_buckets=1 << 14, **config)
        model = Model.init(self.cfg, seed=0, dtype="float64")
        self.learner = WideAdaGrad.for_model(model, np.zeros(model.num_params), l2=1e-3)

    def _features(self, context: str, history: list[str] | None) -> tuple:
        """(idx, val, z_rest 0, pair, where the domain key sits): the row as the daemon's
        wide path hands it to its learner (`wide_row`)."""
        idx, val, pair, novel_at = wide_row(source_batch([(context, history)], self.cfg), 0)
        return idx, val, 0.0, pair, novel_at

    def learn(self, context: str, history: list[str] | None, label: float) -> None:
        idx, val, z_rest, pair, novel_at = self._features(context, history)
        self.learner.learn(idx, val, z_rest, label, 1.0, pair, novel_at=novel_at)

    def logit(self, context: str, history: list[str] | None = None) -> float:
        idx, val, z_rest, pair, novel_at = self._features(context, history)
        return self.learner.logit(idx, val, z_rest, pair, novel_at=novel_at)
