"""The tiny model learns a synthetic gate policy from scratch (held-out alignment)."""

from __future__ import annotations

import numpy as np
import pytest

from gated.engine import AdamW, Model, ModelConfig, build_batch, source_batch, train_step
from gated.synthetic import SyntheticGateway

MAX_STEPS = 600


@pytest.mark.slow
def test_tiny_model_learns_gate_and_reasons():
    cfg = ModelConfig.tiny()
    train_gen, held_gen = SyntheticGateway(seed=1), SyntheticGateway(seed=2)
    held = [held_gen.example() for _ in range(400)]
    held_batch = build_batch(held, cfg)
    model = Model.init(cfg, seed=0)
    opt = AdamW.for_model(model, lr=3e-3)

    def held_out():
        p = model.predict_proba(held_batch)
        return float(np.mean((p >= 0.5) == (held_batch["label"] >= 0.5))), model.loss(
            held_batch)[1]["ce"]

    def reasons_exact() -> float:
        """Share of held-out calls whose greedy-decoded reason is exactly the policy's."""
        hits = sum(model.greedy_decode(source_batch([(ex["context"], ex["history"])], cfg),
                                       max_len=24) == ex["reason"] for ex in held[:50])
        return hits / 50

    _, ce_start = held_out()
    alignment, ce, exact, steps = 0.0, ce_start, 0.0, 0
    while steps < MAX_STEPS:
        for _ in range(25):
            train_step(model, opt, build_batch([train_gen.example() for _ in range(32)], cfg))
        steps += 25
        alignment, ce = held_out()
        if alignment >= 0.98 and ce <= 0.5 * ce_start:
            exact = reasons_exact()
            if exact >= 0.9:
                break
    assert alignment >= 0.98, f"held-out alignment {alignment:.3f} after {steps} steps"
    assert ce <= 0.5 * ce_start, f"reason CE {ce:.3f} vs start {ce_start:.3f}"
    # The decoder produces the policy's reasons, not just a lower loss.
    assert exact >= 0.9, f"only {exact:.0%} of held-out reasons decoded exactly"
