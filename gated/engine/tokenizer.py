"""Byte-level tokenizer, the source encoding and the batch builder (DESIGN.md 1 and 2).

Ids 0..255 are UTF-8 bytes; 256 PAD, 257 BOS, 258 EOS, 259 SEP.

The source (format 2, docs/design.md) puts the call being judged FIRST and whole, then the
session history newest-first, each entry ``SEP`` + an abbreviation of it::

    <current call>  SEP <previous call, abbreviated>  SEP <the one before>  ...

Every source token carries a segment id (0 = the current call, 1 = history) that the
model embeds, and the gate pools the two segments apart. Measured on realistic traffic,
the old layout (history first, the call at the end, the most recent bytes kept, one pool
over everything) let the history drown the call. Rules:

- The current call is never cut for history. Only when it alone is longer than
  ``max_seq_len`` is it cut, keeping its first three quarters and its last quarter around
  `` ... `` (the tool name and first arguments lead; a shell pipe's target ends it).
- A history entry is abbreviated to a byte budget: JSON quotes and braces dropped,
  whitespace collapsed, then the tool name (at most a third of the budget) and the TAIL
  of the arguments (paths and file names end there: ``fs.read path: /w/.env``; at 12
  bytes ``fs.r rets.yml``). The budget is the room the call leaves,
  shared among the newest ``max_history`` entries, clamped to
  ``[history_entry_min, history_entry_max]``; entries that no longer fit are dropped,
  oldest first. With the flint defaults a 90-byte call leaves room for 12 entries of 13
  bytes: a secret read 10 calls back is still in the source.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .config import ModelConfig
from .wide import (
    NGRAM_END,
    NOVEL_AT,
    _parse_call,
    call_destination,
    pad_features,
    structured_features,
    wide_features,
)
from .wide_pair import pair_features

PAD, BOS, EOS, SEP = 256, 257, 258, 259
CUT_MARK = b" ... "
_JSON_NOISE = str.maketrans("", "", '{}"')


def fit_call(data: bytes, max_len: int) -> bytes:
    """The current call, cut only when it alone exceeds `max_len`: 3/4 head, 1/4 tail."""
    if len(data) <= max_len:
        return data
    if max_len <= len(CUT_MARK) + 2:
        return data[:max_len]
    tail = max_len // 4
    head = max_len - tail - len(CUT_MARK)
    return data[:head] + CUT_MARK + data[len(data) - tail:]


def abbreviate(entry: str, budget: int) -> bytes:
    """A history entry in at most `budget` bytes: tool name + the tail of its arguments."""
    data = " ".join(entry.translate(_JSON_NOISE).split()).encode("utf-8")
    if len(data) <= budget:
        return data
    tool, _, rest = data.partition(b" ")
    # The arguments' tail tells calls of one tool apart (config/secrets.yml vs
    # config/settings.yml): the tool name gets at most a third of the budget.
    tool = tool[: max(1, budget // 3)]
    keep = budget - len(tool) - 1
    if keep <= 0 or not rest:
        return data[:budget]
    return tool + b" " + rest[len(rest) - keep:]


def encode_source(context: str, history: Sequence[str] | None,
                  cfg: ModelConfig) -> tuple[list[int], list[int]]:
    """(token ids, segment ids) of a source: the call, then SEP + abbreviated history
    entries newest-first. Segment 0 is the call, 1 the history (its SEPs included)."""
    if cfg.source_format == 1:
        return _encode_source_v1(context, history, cfg.max_seq_len)
    ids = list(fit_call(context.encode("utf-8"), cfg.max_seq_len)) or [SEP]
    n_call = len(ids)
    room = cfg.max_seq_len - n_call
    entries = list(history or ())[::-1][: cfg.max_history]
    if entries and room > 1:
        budget = min(cfg.history_entry_max,
                     max(cfg.history_entry_min, room // len(entries) - 1))
        for entry in entries:
            short = abbreviate(entry, budget)
            if 1 + len(short) > room:
                break
            ids.append(SEP)
            ids.extend(short)
            room -= 1 + len(short)
    return ids, [0] * n_call + [1] * (len(ids) - n_call)


def _encode_source_v1(context: str, history: Sequence[str] | None,
                      max_len: int) -> tuple[list[int], list[int]]:
    """The pre-2026-11-23 layout, for the ablation only: ``h0 SEP h1 ... SEP context``
    keeping the LAST max_len tokens, everything one segment (so one pool)."""
    ids: list[int] = []
    for call in history or ():
        ids.extend(call.encode("utf-8"))
        ids.append(SEP)
    if not history:
        ids.append(SEP)
    ids.extend(context.encode("utf-8"))
    ids = ids[-max_len:]
    return ids, [0] * len(ids)


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


def pad_rows(rows: Sequence[Sequence[int]], min_len: int = 1, fill: int = PAD) -> np.ndarray:
    """Right-pad int rows with `fill` into an int64 [B, L] array."""
    length = max(min_len, max((len(r) for r in rows), default=0))
    out = np.full((len(rows), length), fill, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def source_batch(items: Sequence[tuple[str, Sequence[str] | None]],
                 cfg: ModelConfig) -> dict[str, np.ndarray]:
    """The encoder's inputs for (context, history) pairs, padded to the longest row:
    ``src`` [B, S] ids, ``seg`` [B, S] segment ids, and the wide path's sparse features
    ``wide_idx`` / ``wide_val`` [B, K] (empty [B, 1] zeros when the model has none), and
    the pair term's two sides ``wide_pc_*`` / ``wide_ph_*`` (with ``wide_ph_grp``, each
    history key's entry) when the model has one; where the n-grams end (`NGRAM_END`) and
    where the domain key and its first-seen mark sit (`NOVEL_AT`) when the model reads
    them."""
    if not items:
        raise ValueError("source_batch needs at least one (context, history) pair")
    encoded = [encode_source(c, h, cfg) for c, h in items]
    out = {"src": pad_rows([ids for ids, _ in encoded]),
           "seg": pad_rows([seg for _, seg in encoded], fill=0)}
    if cfg.wide_buckets:
        feats = [wide_features(ids, seg, cfg.wide_ngram, cfg.wide_buckets,
                               cfg.wide_history_scale, cfg.wide_bias)
                 for ids, seg in encoded]
        if cfg.wide_familiarity:
            out[NGRAM_END] = np.array([len(f[0]) for f in feats], np.int64)
        if (cfg.wide_call_words or cfg.wide_history_cross or cfg.wide_call_shapes
                or cfg.wide_known_names or cfg.wide_sensitive_files or cfg.wide_endpoints
                or cfg.wide_sql_statements or cfg.wide_path_places or cfg.wide_call_domains):
            feats = [(np.concatenate([i, si]), np.concatenate([v, sv]))
                     for (i, v), (si, sv) in zip(
                         feats, (structured_features_of(c, h, cfg) for c, h in items),
                         strict=True)]
        out["wide_idx"], out["wide_val"] = pad_features(feats)
        if cfg.wide_novel_destinations:  # the domain key and its mark end each such row
            out[NOVEL_AT] = np.array(
                [len(f[0]) - 2 if call_destination(_parse_call(c)[1]) is not None else -1
                 for f, (c, _) in zip(feats, items, strict=True)], np.int64)
        if cfg.wide_pair_rank:
            pairs = [pair_features(c, h, cfg.wide_pair_buckets, cfg.wide_sensitive_files,
                                   cfg.wide_egress_calls, cfg.wide_pair_destination,
                                   cfg.pair_destination_rows, cfg.wide_sensitive_places,
                                   cfg.wide_pair_history)
                     for c, h in items]
            out["wide_pc_idx"], out["wide_pc_val"] = pad_features([p[:2] for p in pairs])
            out["wide_ph_idx"], out["wide_ph_val"] = pad_features([p[2:4] for p in pairs])
            out["wide_ph_grp"] = pad_features([(p[4], p[3]) for p in pairs])[0]  # entries
    return out


def structured_features_of(context: str, history: Sequence[str] | None,
                           cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """The structured wide features of one source (`structured_features`) at `cfg`'s
    scales and switches: what `source_batch` adds to the byte n-grams."""
    return structured_features(context, history, cfg.wide_buckets, cfg.wide_call_words,
                               cfg.wide_history_cross, cfg.wide_call_shapes,
                               cfg.wide_known_names, cfg.wide_sensitive_files,
                               cfg.wide_endpoints, cfg.wide_sql_statements,
                               cfg.wide_path_places, cfg.wide_shape_hosts,
                               cfg.wide_call_domains, cfg.wide_sensitive_call_places,
                               cfg.wide_endpoint_addresses, cfg.wide_novel_destinations)


def build_batch(examples: Sequence[dict[str, Any]], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """A training batch from example dicts {context, history, reason, label, weight}.

    Shapes are padded to the longest row of this batch (not to max_seq_len): most tool
    calls are short and attention cost grows with the square of the length.
    """
    if not examples:
        raise ValueError("build_batch needs at least one example")
    tgt_in, tgt_out = [], []
    for ex in examples:
        t_in, t_out = encode_reason(ex.get("reason"), cfg.max_seq_len)
        tgt_in.append(t_in)
        tgt_out.append(t_out)
    t_len = max(len(r) for r in tgt_in)
    return {
        **source_batch([(ex["context"], ex.get("history")) for ex in examples], cfg),
        "tgt_in": pad_rows(tgt_in, t_len),
        "tgt_out": pad_rows(tgt_out, t_len),
        "label": np.array([float(ex["label"]) for ex in examples], dtype=np.float64),
        "weight": np.array([float(ex.get("weight", 1.0)) for ex in examples], dtype=np.float64),
    }
