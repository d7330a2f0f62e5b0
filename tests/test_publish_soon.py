"""`train.swap_soon_seconds`: a fresh call labelled block that serving answered `ask`
leaning allow (0.5 <= p_allow < the allow band), or that a person corrected to block while
serving said p_allow >= 0.5, makes the next publication due that many seconds after the
last one instead of `swap_every_seconds` (publication.py `publish_soon`); a block serving
was sure to allow (the noisy gate's mistake, most often) waits for the ordinary cadence,
and so does every block in the state's warm-up (`Monitor.warm`).
A real Store in tmp_path and the trainer on a clock the test moves (`Trainer.use_clock`),
so the cadence is decided by the test's seconds and not by how fast this machine is;
serving's answer is set by its calibration's intercept (a fresh tiny model's gate logit
is 0 on every call)."""

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
#: serving's p_allow on every call, by the calibration's intercept b (p = sigmoid(z + b))
UNSURE_ALLOW, SURE_ALLOW, BLOCK = 1.0, 30.0, -30.0  # p 0.73 (`ask`), ~1 (`allow`), ~0


def _published_after(tmp_path, signals: list[dict], *, at: float, served: float,
                     soon: float = 0.2, warm_up: int = 0) -> bool:
    """Train on `signals` `at` seconds after the last publication, serving answering every
    call as the intercept `served` says, the state's warm-up `warm_up` signals
    (`allow_band_after`; 0: warm from the start); True if the trainer published a
    version."""
    settings = dataclasses.replace(TrainConfig(), swap_every_seconds=10.0,
                                   swap_every_steps=1000, swap_soon_seconds=soon,
                                   promotion_holdout_share=0.0, allow_band_after=warm_up)
    store = Store(tmp_path / "s")
    trainer, serving = build_trainer(store, ModelConfig.tiny(), settings, seed=0)
    assert serving.bands.allow == pytest.approx(0.9)  # UNSURE_ALLOW's p is below it
    now = [0.0]
    trainer.use_clock(lambda: now[0])  # the last publication's time is 0 from here
    serving.calibration = Calibration(1.0, served)
    before = serving.current.version
    now[0] = at
    store.append_signals(signals)
    trainer.train_on(store.read_signals(0, 64))
    published = serving.current.version > before
    if published:  # to LMDB too, where the daemon's serving process reads it
        assert int(store.published_info()["version"]) == serving.current.version
    store.close()
    return published


def test_a_block_serving_was_unsure_of_publishes_after_the_soon_interval(tmp_path):
    assert _published_after(tmp_path, [*ALLOWED, BLOCKED], at=0.5, served=UNSURE_ALLOW)


def test_not_in_the_warm_up_where_one_block_swings_the_young_state(tmp_path):
    assert not _published_after(tmp_path, [*ALLOWED, BLOCKED], at=0.5, served=UNSURE_ALLOW,
                                warm_up=6)
    # the block is the 6th signal scored: from there on the state is warm
    assert _published_after(tmp_path / "warm", [*ALLOWED, ALLOWED[0], BLOCKED], at=0.5,
                            served=UNSURE_ALLOW, warm_up=5)


def test_only_after_the_soon_interval(tmp_path):
    assert not _published_after(tmp_path, [*ALLOWED, BLOCKED], at=0.1, served=UNSURE_ALLOW)


def test_a_second_unsure_block_does_not_bring_it_sooner(tmp_path):
    """Each unsure block asks for the same due time, `swap_soon_seconds` after the last
    publication (each one used to move it `swap_every_seconds - swap_soon_seconds` earlier:
    here the second made it due 9.6 s in the past), and the soon interval then holds."""
    second = {"context": "shell.exec rm -rf /var/lib/db", "decision": "block"}
    assert not _published_after(tmp_path, [*ALLOWED, BLOCKED, second], at=0.1,
                                served=UNSURE_ALLOW)
    assert _published_after(tmp_path / "later", [*ALLOWED, BLOCKED, second], at=0.5,
                            served=UNSURE_ALLOW)


def test_off_the_block_waits_for_the_ordinary_cadence(tmp_path):
    assert not _published_after(tmp_path, [*ALLOWED, BLOCKED], at=0.5, served=UNSURE_ALLOW,
                                soon=0.0)


@pytest.mark.parametrize("served", [UNSURE_ALLOW, SURE_ALLOW, BLOCK])
def test_allowed_calls_wait_for_the_ordinary_cadence(tmp_path, served):
    assert not _published_after(tmp_path, ALLOWED, at=0.5, served=served)


@pytest.mark.parametrize("served", [SURE_ALLOW, BLOCK])
def test_a_block_serving_was_sure_of_waits(tmp_path, served):
    """Sure to allow: on a noisy gate most often the gate's mistake; sure to block: right."""
    assert not _published_after(tmp_path, [*ALLOWED, BLOCKED], at=0.5, served=served)


@pytest.mark.parametrize("served", [UNSURE_ALLOW, SURE_ALLOW])
def test_a_correction_to_block_publishes_soon_however_sure_serving_was(tmp_path, served):
    assert _published_after(tmp_path, [*ALLOWED, MISSED], at=0.5, served=served)


def test_a_correction_to_block_serving_already_blocks_waits(tmp_path):
    assert not _published_after(tmp_path, [*ALLOWED, MISSED], at=0.5, served=BLOCK)


def test_a_correction_to_allow_waits_for_the_ordinary_cadence(tmp_path):
    assert not _published_after(tmp_path, [*ALLOWED, OVERBLOCKED], at=0.5,
                                served=UNSURE_ALLOW)
