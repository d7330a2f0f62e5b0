"""Byte tokenizer and batch builder."""

from __future__ import annotations

import numpy as np

from gated.engine import BOS, EOS, PAD, SEP, ModelConfig, build_batch, decode_bytes, encode_source
from gated.engine.tokenizer import encode_reason


def test_source_is_history_sep_joined_then_sep_then_context():
    ids = encode_source("c", ["a", "bb"], 100)
    assert ids == [97, SEP, 98, 98, SEP, 99]
    assert encode_source("c", None, 100) == [SEP, 99]
    assert encode_source("é", [], 100) == [SEP, 0xC3, 0xA9]  # UTF-8 bytes


def test_source_keeps_the_most_recent_bytes():
    ids = encode_source("tail-context", ["x" * 50], 8)
    assert len(ids) == 8 and bytes(ids).decode() == "-context"


def test_reason_targets():
    assert encode_reason(None, 32) == ([BOS], [])
    assert encode_reason("", 32) == ([BOS], [])
    t_in, t_out = encode_reason("no", 32)
    assert t_in == [BOS, 110, 111] and t_out == [110, 111, EOS]
    t_in, t_out = encode_reason("abcdefghij", 4)
    assert len(t_in) == len(t_out) == 4 and t_out[-1] == EOS


def test_build_batch_shapes_and_padding():
    cfg = ModelConfig.tiny()
    batch = build_batch([
        {"context": "ls", "history": None, "reason": "ok", "label": 1, "weight": 1.0},
        {"context": "rm -rf /", "history": ["cd /"], "reason": None, "label": 0, "weight": 4.0},
    ], cfg)
    assert batch["src"].shape == (2, len("cd /") + 1 + len("rm -rf /"))
    assert batch["src"][0, 3] == PAD and batch["src"][1, -1] == ord("/")
    assert batch["tgt_in"].tolist() == [[BOS, 111, 107, ], [BOS, PAD, PAD]]
    assert batch["tgt_out"].tolist() == [[111, 107, EOS], [PAD, PAD, PAD]]
    np.testing.assert_array_equal(batch["label"], [1.0, 0.0])
    np.testing.assert_array_equal(batch["weight"], [1.0, 4.0])


def test_decode_stops_at_eos_and_skips_specials():
    assert decode_bytes([104, 105, EOS, 106]) == "hi"
    assert decode_bytes([BOS, 104, PAD, 105]) == "hi"
