"""`train.swap_soon_seconds`: a call labelled block (by the gate or a person's correction)
that serving answered with p_allow >= 0.5 makes the next publication due that many seconds
after the last one instead of `swap_every_seconds` (publication.py `publish_soon`). A real Store in
tmp_path and the trainer on a clock the test moves (`Trainer.use_clock`), so the cadence
is decided by the test's seconds and not by how fast this machine is."""

from __future__ import annotations

import dataclasses

import pytest

from gated.config import TrainConfig
from gated.daemon.serving import Calibration
from gated.daemon.trainer import build_trainer
from gated.engine import ModelConfig
from gated.store import Store

ALLOWED = [{"context": f"fs.read src/{i}.py", "decision": "allow"} for i in range(4)]
BLOCKED = {"context": "shell.exec rm -rf /srv/data", "decision": "block"}
#: a person's corrections: the gate allowed a call that is blocked, and the other way round
MISSED = {"context": "fs.read /etc/shadow", "decision": "allow", "feedback": "false_negative"}
OVERBLOCKED = {"context": "fs.read src/9.py", "decision": "block",
               "feedback": "false_positive"}


def _published_after(tmp_path, signals: list[dict], soon: float, lean_allow: bool,
                     at: float) -> bool:
    """Train on `signals` at `at` seconds after the last publication, with serving leaning
    `allow` on every call (`lean_allow`) or `block`; True if a version was published."""
    settings = dataclasses.replace(TrainConfig(), swap_every_seconds=10.0,
                                   swap_every_steps=1000, swap_soon_seconds=soon,
                                   promotion_holdout_share=0.0)
    store = Store(tmp_path / "s")
    trainer, serving = build_trainer(store, ModelConfig.tiny(), settings, seed=0)
    now = [0.0]
    trainer.use_clock(lambda: now[0])  # the last publication's time is 0 from here
    serving.calibration = Calibration(1.0, 30.0 if lean_allow else -30.0)
    before = serving.current.version
    now[0] = at
    store.append_signals(signals)
    trainer.train_on(store.read_signals(0, 64))
    published = serving.current.version > before
    if published:  # to LMDB too, where the daemon's serving process reads it
        assert int(store.published_info()["version"]) == serving.current.version
    store.close()
    return published


def test_a_block_serving_answered_allow_publishes_after_the_soon_interval(tmp_path):
    assert _published_after(tmp_path, [*ALLOWED, BLOCKED], soon=0.2, lean_allow=True, at=0.5)


def test_only_after_the_soon_interval(tmp_path):
    assert not _published_after(tmp_path, [*ALLOWED, BLOCKED], soon=0.2, lean_allow=True,
                                at=0.1)


def test_off_the_block_waits_for_the_ordinary_cadence(tmp_path):
    assert not _published_after(tmp_path, [*ALLOWED, BLOCKED], soon=0.0, lean_allow=True,
                                at=0.5)


@pytest.mark.parametrize("lean_allow", [True, False])
def test_allowed_calls_wait_for_the_ordinary_cadence(tmp_path, lean_allow):
    assert not _published_after(tmp_path, ALLOWED, soon=0.2, lean_allow=lean_allow, at=0.5)


def test_a_block_serving_already_answered_block_waits(tmp_path):
    assert not _published_after(tmp_path, [*ALLOWED, BLOCKED], soon=0.2, lean_allow=False,
                                at=0.5)


def test_a_correction_to_block_that_serving_answered_allow_publishes_soon(tmp_path):
    assert _published_after(tmp_path, [*ALLOWED, MISSED], soon=0.2, lean_allow=True, at=0.5)


def test_a_correction_to_allow_waits_for_the_ordinary_cadence(tmp_path):
    assert not _published_after(tmp_path, [*ALLOWED, OVERBLOCKED], soon=0.2,
                                lean_allow=False, at=0.5)
