"""bench/bench_learning.py's drift log: where the trainer was at each alarm and verdict.

Why: a dip inside an alarm's window reads differently before and after its verdict, and
the run's trace does not say when either came (docs/learning.md, "A withdrawn alarm gives
its sums back"). A real trainer on a real store, its drift responses called as the
monitor calls them; the report's line as bench_learning.py prints it."""

from __future__ import annotations

import sys
from pathlib import Path

from gated.config import TrainConfig
from gated.daemon.trainer import build_trainer
from gated.engine import ModelConfig
from gated.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from bench_learning import DriftLog  # noqa: E402
from learning_report import _drift_verdict  # noqa: E402


def test_the_drift_log_keeps_the_trainers_position_at_each_alarm_and_verdict(tmp_path):
    store = Store(tmp_path / "s")
    trainer, _ = build_trainer(store, ModelConfig.tiny(), TrainConfig(), seed=0)
    trainer.events = log = DriftLog(lambda: trainer.status.last_trained_seq)
    trainer.status.last_trained_seq = 130
    trainer._on_drift(100, 130)
    trainer.status.last_trained_seq = 190
    trainer._on_drift_verdict(100, False)
    trainer.status.last_trained_seq = 4100
    trainer._on_drift(4020, 4100)
    trainer.status.last_trained_seq = 4160
    trainer._on_drift_verdict(4020, True)
    assert [v[:2] + v[3:] for v in log.verdicts] == [(100, False, 130, 190),
                                                     (4020, True, 4100, 4160)]
    assert _drift_verdict(*log.verdicts[0]) == ("100 (alarm at 130, verdict at 190) "
                                                "withdrawn, replay kept")
    assert _drift_verdict(*log.verdicts[1]).startswith("4,020 (alarm at 4,100, verdict at "
                                                      "4,160) confirmed, ")
    # a result from before the positions were kept: the first three fields
    assert _drift_verdict(4020, True, 12) == "4,020 confirmed, 12 replay examples dropped"
    store.close()
