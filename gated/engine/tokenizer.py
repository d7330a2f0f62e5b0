"""Byte-level tokenizer and the batch builder (DESIGN.md sections 1 and 2).

Ids 0..255 are UTF-8 bytes; 256 PAD, 257 BOS, 258 EOS, 259 SEP. A source is the
session history joined by SEP, then SEP, then the current context; when it is too long
the most recent bytes are kept, because the call being judged is at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .config import ModelConfig

PAD, BOS, EOS, SEP = 256, 257, 258, 259


def encode_source(context: str, history: Sequence[str] | None, max_len: int) -> list[int]:
    """Token ids of `history[0] SEP history[1] ... SEP context`, keeping the last `max_len`."""
    ids: list[int] = []
    for call in history or ():
        ids.extend(call.encode("utf-8"))
        ids.append(SEP)
    # DESIGN: "history joined with SEP, then SEP, then context" -- with no history the
    # source is SEP + context, so it always has at least one real token.
    if not history:
        ids.append(SEP)
    ids.extend(context.encode("utf-8"))
    return ids[-max_len:]


def encode_reason(reason: str | None, max_len: int) -> tuple[list[int], list[int]]:
    """(tgt_in, tgt_out) for a reason: BOS + reason and reason + EOS, at most `max_len` each.

    An example without a reason has tgt_in = [BOS] and no target tokens.
    """
    if not reason:
        return [BOS], []
    body = list(reason.encode("utf-8"))[: max_len - 1]
    return [BOS, *body], [*body, EOS]


def decode_bytes(ids: Sequence[int]) -> str:
    """Text of the byte ids up to the first EOS (special ids are dropped)."""
    out = bytearray()
    for t in ids:
        if t == EOS:
            break
        if 0 <= t < 256:
            out.append(t)
    return out.decode("utf-8", errors="replace")


def pad_rows(rows: Sequence[Sequence[int]], min_len: int = 1) -> np.ndarray:
    """Right-pad int rows with PAD into an int64 [B, L] array."""
    length = max(min_len, max((len(r) for r in rows), default=0))
    out = np.full((len(rows), length), PAD, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def build_batch(examples: Sequence[dict[str, Any]], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """A training batch from example dicts {context, history, reason, label, weight}.

    Shapes are padded to the longest row of this batch (not to max_seq_len): most tool
    calls are short and attention cost grows with the square of the length.
    """
    if not examples:
        raise ValueError("build_batch needs at least one example")
    src, tgt_in, tgt_out = [], [], []
    for ex in examples:
        src.append(encode_source(ex["context"], ex.get("history"), cfg.max_seq_len))
        t_in, t_out = encode_reason(ex.get("reason"), cfg.max_seq_len)
        tgt_in.append(t_in)
        tgt_out.append(t_out)
    t_len = max(len(r) for r in tgt_in)
    return {
        "src": pad_rows(src),
        "tgt_in": pad_rows(tgt_in, t_len),
        "tgt_out": pad_rows(tgt_out, t_len),
        "label": np.array([float(ex["label"]) for ex in examples], dtype=np.float64),
        "weight": np.array([float(ex.get("weight", 1.0)) for ex in examples], dtype=np.float64),
    }


def source_batch(items: Sequence[tuple[str, Sequence[str] | None]], cfg: ModelConfig) -> np.ndarray:
    """PAD-padded source ids [B, S] for prediction requests (context, history) pairs."""
    return pad_rows([encode_source(c, h, cfg.max_seq_len) for c, h in items])
