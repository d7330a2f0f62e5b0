"""Each feature group's share of the wide path's logit, on probes the stream never showed.

Why (docs/learning.md, "What the first checkpoint's logits are made of"): a probe the
wide path gets wrong at the first checkpoint is wrong either because no feature it
shares with the stream says what it is (a template never shown: knowledge the first
signals do not hold) or because the features that know are outweighed by others (the
call's byte n-grams carrying the tool's block rate, the bias): the two ask for different
remedies, and only the logit's parts tell them apart. The wide logit is linear in its
features, so each group's part is the learner's logit over that group's features alone
(`WideAdaGrad.logit` / `WideBag.logit` with no pair term: the members' mean), the parts
sum to the linear logit, and the pair term's part is the full logit less the linear one.

Used by bench_wide_features.py `--parts N`: the table at the checkpoint after N signals.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

import numpy as np

from gated.daemon.trainer.wide_path import wide_row
from gated.engine.config import ModelConfig
from gated.engine.tokenizer import encode_source, source_batch, structured_features_of
from gated.engine.wide import BIAS_BUCKET, _segment_features

#: The structured groups: (name in the table, the ModelConfig field that scales it; the
#: other groups' fields are 0 when one group is computed)
STRUCTURED = (("words", "wide_call_words"), ("cross", "wide_history_cross"),
              ("shapes", "wide_call_shapes"), ("known", "wide_known_names"),
              ("sensitive", "wide_sensitive_files"), ("endpoints", "wide_endpoints"),
              ("sql", "wide_sql_statements"), ("places", "wide_path_places"),
              ("domain", "wide_call_domains"))  # the domain key and its first-seen mark
GROUPS = ("bias", "call n-grams", "history n-grams",
          *(name for name, _ in STRUCTURED), "pair")


def _group_features(context: str, history: Sequence[str] | None,
                    cfg: ModelConfig) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(bucket ids, values) of each linear group of one source, as `source_batch` builds
    them for the wide path (the same functions; a structured group by
    `structured_features_of` at a copy of `cfg` whose other groups' scales are 0)."""
    ids, segs = encode_source(context, history, cfg)
    arr, seg = np.asarray(ids, dtype=np.uint64), np.asarray(segs)
    call = _segment_features(arr[seg == 0], 0, cfg.wide_ngram, cfg.wide_buckets)
    hist = _segment_features(arr[seg == 1], 1, cfg.wide_ngram, cfg.wide_buckets)
    out = {"bias": (np.array([BIAS_BUCKET]), np.array([cfg.wide_bias], np.float64)),
           "call n-grams": call,
           "history n-grams": (hist[0], cfg.wide_history_scale * hist[1])}
    off = {field: 0.0 for _, field in STRUCTURED} | {"wide_novel_destinations": 0.0}
    for name, field in STRUCTURED:
        alone = {**off, field: getattr(cfg, field)}
        if field == "wide_call_domains":  # the first-seen mark comes with its domain key
            alone["wide_novel_destinations"] = cfg.wide_novel_destinations
        out[name] = structured_features_of(context, history, dataclasses.replace(cfg, **alone))
    return out


def _novel_at(name: str, idx: np.ndarray, cfg: ModelConfig) -> int:
    """Where a group's domain key sits when its first-seen mark follows it (the domain
    group of a call with a destination: key, mark), so the learner reads the mark as the
    model does (`novel_values`); -1 otherwise."""
    return 0 if name == "domain" and cfg.wide_novel_destinations and len(idx) == 2 else -1


def logit_parts(learner, cfg: ModelConfig, context: str,
                history: Sequence[str] | None) -> dict[str, float]:
    """Each group's part of `learner`'s wide logit of one source, and the full logit
    (``"z"``); the parts but ``"z"`` sum to it."""
    parts = {name: float(learner.logit(idx, val, 0.0, None,
                                       novel_at=_novel_at(name, idx, cfg))) if len(idx) else 0.0
             for name, (idx, val) in _group_features(context, history, cfg).items()}
    idx, val, pair, at = wide_row(source_batch([(context, history)], cfg), 0)
    z = float(learner.logit(idx, val, 0.0, pair, novel_at=at))
    parts["pair"] = (z - float(learner.logit(idx, val, 0.0, None, novel_at=at))
                     if pair is not None else 0.0)
    return {**parts, "z": z}


def parts_table(learner, cfg: ModelConfig, events: Sequence) -> list[str]:
    """Markdown rows: per (tool, TRUE category, decided right or wrong at z >= 0) the
    probes' count, mean logit and each group's mean part; groups that are 0 throughout
    are left out."""
    rows: dict[tuple, list[dict]] = collections.defaultdict(list)
    for e in events:
        context, history = e.signal["context"], e.signal.get("history")
        p = logit_parts(learner, cfg, context, history)
        rows[(context.split(" ", 1)[0], e.category,
              "right" if (p["z"] >= 0) == e.true_allow else "WRONG")].append(p)
    shown = [g for g in GROUPS if any(abs(p[g]) > 5e-3 for ps in rows.values() for p in ps)]
    out = ["| tool | TRUE | decided | probes | z | " + " | ".join(shown) + " |",
           "| --- | --- | --- | ---: | ---: |" + " ---: |" * len(shown)]
    for (tool, category, verdict), ps in sorted(rows.items()):
        out.append(f"| {tool} | {category} | {verdict} | {len(ps)} | "
                   f"{np.mean([p['z'] for p in ps]):+.2f} | "
                   + " | ".join(f"{np.mean([p[g] for p in ps]):+.2f}" for g in shown) + " |")
    return out
