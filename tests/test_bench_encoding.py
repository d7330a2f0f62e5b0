"""bench/bench_encoding.py: the offline ablation's pieces on a model small enough for CI
(the accuracies themselves are the benchmark's, not asserted here)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from gated.config import TrainConfig
from gated.engine import ModelConfig, source_batch
from gated.traffic import GatewayTraffic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_encoding  # noqa: E402
import bench_learning  # noqa: E402


def test_model_overrides_take_each_fields_type_and_refuse_what_is_not_a_field():
    got = bench_encoding.model_overrides(["d_model=64", "wide_bias=0.5", "n_heads=4"])
    assert got == {"d_model": 64, "wide_bias": 0.5, "n_heads": 4}
    assert isinstance(got["d_model"], int) and isinstance(got["wide_bias"], float)
    # a bool field read as one (bool("false") would be True)
    assert bench_encoding.model_overrides(["wide_pair_block_only=false"]) == {
        "wide_pair_block_only": False}
    for bad in (["d_model"], ["no_such_field=1"], ["d_model=wide"],
                ["wide_pair_block_only=maybe"]):
        with pytest.raises(SystemExit):
            bench_encoding.model_overrides(bad)


def test_bench_learnings_set_takes_train_settings_and_exits_clearly_on_the_rest():
    """`bench_learning.py --set` (the same parser): a [train] setting of its field's type;
    a wrong one ends the run with the option's message, not a ValueError's traceback."""
    got = bench_learning.field_overrides(
        TrainConfig, ["warmup_steps=5", "drift_wide_unscaled_examples=0", "lr=3e-4"], "--set")
    assert got == {"warmup_steps": 5, "drift_wide_unscaled_examples": 0, "lr": 3e-4}
    assert isinstance(got["warmup_steps"], int) and isinstance(got["lr"], float)
    for bad, said in ((["warmup_steps=x"], "'x' is not of type int"),
                      (["warmup_steps"], "KEY=VALUE"), (["d_model=64"], "TrainConfig field")):
        with pytest.raises(SystemExit, match=said):
            bench_learning.field_overrides(TrainConfig, bad, "--set")


def test_the_call_alone_reads_no_history():
    """The history-rule probes come in pairs that differ only in the history: the encoder
    reads both members of a pair alike when fed the call alone, and apart otherwise."""
    # tiny's 32-byte window holds no history; flint's source layout on tiny's width
    cfg = dataclasses.replace(ModelConfig.tiny(), max_seq_len=256, max_history=12,
                              history_entry_min=12, history_entry_max=24)
    pairs = GatewayTraffic(seed=0).history_probes(8, 1)
    for with_history in (True, False):
        src = source_batch(bench_encoding.sources(pairs, with_history), cfg)["src"]
        same = [np.array_equal(a, b) for a, b in zip(src[0::2], src[1::2], strict=True)]
        assert all(same) if not with_history else not any(same)


def test_each_encoding_trains_and_is_scored_every_epoch():
    shrink = {"d_model": 16, "n_heads": 2, "d_ff": 32}
    alone = bench_encoding.run("tiny", bench_encoding.CALL_ALONE, 48, 32, 1, 1e-2, 0, shrink)
    assert alone[0]["history"] == 0.5  # one answer per pair: exactly half right
    for variant in ("v1-deep", "v2-deep"):
        rows = bench_encoding.run("tiny", variant, 48, 32, 2, 1e-2, 0, shrink)
        assert [r["epoch"] for r in rows] == [1, 2]
        for r in rows:
            assert all(0.0 <= r[k] <= 1.0 for k in ("train", "test", "unseen", "history"))
