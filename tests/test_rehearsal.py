"""The trainer's rehearsal (daemon/trainer/rehearsal.py): the whole path once, nothing kept.

On the CPU there is nothing to compile; what can be checked here is that the rehearsal
really runs the trainer's path (steps and swaps happen) and leaves no state behind. Its
purpose -- a GPU's first signals not waiting for kernel compilation -- is measured on a
GPU by bench/bench_learning.py --backend cupy (docs/learning.md)."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from gated.config import TrainConfig
from gated.daemon.trainer.rehearsal import rehearse
from gated.engine import ModelConfig


def _leftovers() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("gated-rehearsal-*")}


def test_rehearsal_runs_the_trainers_path_and_keeps_nothing():
    before = _leftovers()
    done = rehearse(ModelConfig.preset("tiny"), TrainConfig(), "numpy")
    assert done["steps"] >= 1, "the rehearsal took no transformer step"
    assert done["swaps"] >= 2, "the rehearsal published too few snapshots"
    assert _leftovers() == before, "the rehearsal left its temporary store behind"


def test_a_failed_rehearsal_is_logged_and_the_trainer_starts_anyway(caplog):
    """The trainer process's wrapper: a rehearsal that raises (here: a backend that does
    not exist) leaves a WARNING an operator can act on, and returns."""
    from gated.daemon.trainer_process import _rehearse

    with caplog.at_level(logging.WARNING, logger="gated.trainer"):
        _rehearse(ModelConfig.preset("tiny"), TrainConfig(), "no-such-backend")
    assert any("rehearsal on the GPU failed" in r.getMessage() and "starting anyway"
               in r.getMessage() for r in caplog.records)
