"""Which wide-path features and L2? A wide-only replay of the stream, beside the anchor.

The daemon's wide path (engine/wide.py) is a linear learner over the source's features,
stepped by `WideAdaGrad` on every signal. On a CPU it carries most decisions, so what it
can express decides most of issue 10's figures. This script replays the realistic stream
(gated.traffic, `--signals` with policy v1 -> v2 at `--switch-at`) through a wide-only
learner (the transformer's logit held at 0, one update per signal, no lag: what the
daemon's wide path is at best) for each setting of

- ``words``: `ModelConfig.wide_call_words` (argument words keyed by tool and argument),
- ``cross``: `ModelConfig.wide_history_cross` ((tool, method) x history entry's file),
- ``l2``: `TrainConfig.wide_l2`,
- ``pair``: `ModelConfig.wide_pair_rank` (the call x history pair term; optional 4th
  field, default 0), ``pair_lr``: `TrainConfig.wide_pair_lr` (5th, default 0.1) and
  ``pool``: `ModelConfig.wide_pair_pool` (6th, default 0.5, the daemon's: the soft
  minimum over the history's entries; 0 sums the keys, as the tables before the pooling
  did, there with keys deduplicated over the whole history) and ``shapes``:
  `ModelConfig.wide_call_shapes` (7th; the daemon's is 1.0, absent is 0 = none, so the
  commands of the tables before the argument shapes still give those tables), ``lr``:
  `TrainConfig.wide_lr` (8th, default 0.5), ``init``: `ModelConfig.wide_pair_init`
  (9th, default 0.1) and ``veto``: `ModelConfig.wide_pair_veto` (10th, default 0: the
  pair term added to the linear logit; c > 0: the history as a veto), ``pair_l2`` (11th,
  -1: the linear weights' L2), ``known``, ``sensitive`` and ``egress``:
  `ModelConfig.wide_known_names`, `wide_sensitive_files`, `wide_egress_calls` (12th-14th,
  default 0 each: the marks of docs/learning.md, "Known names" and "Egress calls"),
  ``block``: `ModelConfig.wide_pair_block_only` (15th, default 1, the daemon's: the pair
  term bounded to speak only for "block"; 0 = the raw term, as every table before
  docs/learning.md "The history speaks only for block"), ``endpoints``:
  `ModelConfig.wide_endpoints` (16th, default 0: the endpoint marks of docs/learning.md,
  "Endpoint marks"), ``sql``: `ModelConfig.wide_sql_statements` (17th, default 0: the
  SQL statement features, "SQL statements"), ``places``: `ModelConfig.wide_path_places`
  (18th, default 0: "Path places"), ``hosts``: `ModelConfig.wide_shape_hosts` (19th,
  default 0: a URL's host name folded like any value, as before "A host's name in a
  shape"), ``shared``: `ModelConfig.wide_pair_init_shared` (20th, default 0: all the
  pair term's call factors random, as before "The pair term's shared factor"), ``dest``:
  `ModelConfig.wide_pair_destination` (21st, default 0: no destination key, as before "A
  destination on the pair term"), ``domains``: `ModelConfig.wide_call_domains` (22nd,
  default 0: no domain key, as before "A domain key"), ``dest rows``:
  `ModelConfig.wide_pair_destination_share` (23rd, default 0: the destination key among
  the site's rows, on every upload and stepped on both labels, as before "The
  destination's own rows"; today's 1/16 is 0.0625),

with features built by the daemon's own `source_batch`, beside the anchor (bench/anchor.py)
on the same signals, and prints: how many 500-signal checkpoints it is ahead of the anchor
(progressive, vs the TRUE label), the mean and the worst difference, and at two points
(before the change, end) the held-out-value probes (accuracy, block recall, allow
precision) and the history-rule pairs (both members, then the block members -- the secret
read in the window -- and their allow twins apart).

    .venv/bin/python bench/bench_wide_features.py                 # the table in learning.md
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 --grid 0.3,0.3,1e-3
    .venv/bin/python bench/bench_wide_features.py --grid 0.3,0.3,1e-3 --lag 100
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 --signals 8000 \
        --switch-at 7000 --grid 0.3,0.3,1e-3 0.3,0.3,1e-3,8,0.1,0 0.3,0.3,1e-3,8   # pair term
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 --signals 4500 \
        --switch-at 4000 --grid 0.3,0.3,1e-3,8,0.1,0 0.3,0.3,1e-3,8,0.1,0.5      # pooling
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 --signals 4500 \
        --switch-at 4000 --grid 0.3,0.3,1e-3,8,0.1,0.5,0 0.3,0.3,1e-3,8,0.1,0.5,1  # shapes
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 --signals 5500 \
        --switch-at 4000 --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1 \
        0.3,0.3,3e-3,8,0.1,0.5,1,0.3,0.3                   # the wide path's rate (not kept)
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 --signals 5500 \
        --switch-at 4000 --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0 \
        0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,2 \
        0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,1e-2   # the veto, the pair L2 (not kept)
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 --signals 5500 \
        --switch-at 4000 --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,2,0 \
        0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,2,1         # the egress mark (kept)
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 --signals 10000 \
        --switch-at 4000 --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,2,1,0 \
        0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,2,1,1    # the history only for block (kept)
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 --signals 10000 \
        --switch-at 4000 --every 500 --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,2,1,1 \
        0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,4,1,1    # the sensitive marks at 4 (kept)
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 --signals 10000 \
        --switch-at 4000 --every 500 --correction-weight 2 \
        --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,4,1,1  # corrections' weight (not kept)
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 --signals 10000 \
        --switch-at 4000 --every 500 --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,4,1,1,0 \
        0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,4,1,1,2,1,0.5  # endpoints, SQL, places (kept)
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 --signals 10000 \
        --switch-at 4000 --every 500 --init-seed -1 --second-look 200 \
        --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,4,1,1,2,1,0.5,1,1   # a second look (kept)
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 --signals 10000 \
        --switch-at 4000 --every 500 --init-seed -1 --second-look 200 --pair-hold 3 \
        --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,4,1,1,2,1,0.5,1,1   # the hold (kept)
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 --signals 10000 \
        --switch-at 4000 --every 500 --init-seed -1 --second-look 200 --pair-hold 3 \
        --drift-relax 1 \
        --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,4,1,1,2,1,0.5,1,1,1,0.3,0.0625
        # the destination's own rows (kept)
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 --signals 10000 \
        --switch-at 4000 --every 500 --init-seed -1 --second-look 200 --pair-hold 3 \
        --drift-relax 1 \
        --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,4,1,1,2,1,0.5,1,1,1,0.3,0.0625,1
        # the sensitive mark's place (kept)
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 --signals 10000 \
        --switch-at 4000 --every 500 --init-seed -1 --second-look 200 --pair-hold 3 \
        --drift-relax 1 \
        --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,4,1,1,2,1,0.5,1,1,1,0.3,0.0625,1,4
        # the wide path as a bag of 4 (kept; 8 learned a little more)
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 --signals 10000 \
        --switch-at 4000 --every 500 --init-seed -1 --second-look 200 --pair-hold 3 \
        --drift-relax 1 --drift-bag-all 500 \
        --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,4,1,1,2,1,0.5,1,1,1,0.3,0.0625,1,4
        # every member learns after a drift alarm (kept)
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 --signals 10000 \
        --switch-at 4000 --every 500 --init-seed -1 --second-look 200 --pair-hold 3 \
        --drift-relax 1 --drift-bag-all 500 --early-block 2:2000 --call-mark-places \
        --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,4,1,1,2,1,0.5,1,1,1,0.3,0.0625,1,4 \
        [--endpoint-addresses]   # the public address mark (kept)
    .venv/bin/python bench/bench_wide_features.py --seeds 0 1 2 3 4 5 6 7 --signals 10000 \
        --switch-at 4000 --every 500 --init-seed -1 --second-look 200 --pair-hold 3 \
        --drift-relax 1 --drift-bag-all 500 --early-block 2:2000 --call-mark-places \
        --endpoint-addresses --drift-contra 0.1:500:0 --lag 25 \
        --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,4,1,1,2,1,0.5,1,1,1,0.3,0.0625,1,4 \
        [--pair-history 10]   # the pair term's window (kept: today's defaults)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
from anchor import HashedNgramLR, anchor_text, label_weight  # noqa: E402
from trace_groups import after_credential_read  # noqa: E402
from wide_parts import parts_table  # noqa: E402

from gated.config import TrainConfig  # noqa: E402
from gated.daemon.trainer.wide_path import (  # noqa: E402
    adapt_to_drift,
    adapt_to_drift_verdict,
    early_block_weight,
)
from gated.engine.config import ModelConfig  # noqa: E402
from gated.engine.model import Model  # noqa: E402
from gated.engine.tokenizer import source_batch  # noqa: E402
from gated.engine.wide import NGRAM_END, NOVEL_AT, PAIR_KEYS  # noqa: E402
from gated.engine.wide_learner import NO_DOUBT, WideAdaGrad  # noqa: E402
from gated.online.drift import CheckedTest, PageHinkley  # noqa: E402
from gated.online.monitor import MonitorSettings  # noqa: E402
from gated.online.second_look import SecondLook  # noqa: E402
from gated.signals import context_fingerprint  # noqa: E402
from gated.traffic import GatewayTraffic, destination_class, parse_call  # noqa: E402

CHECK = 500
#: (words, cross, l2): before (n-grams only, l2 1e-5), each change alone, and together
DEFAULT_GRID = ["0,0,1e-5", "0,0,1e-3", "0.3,0,1e-5", "0.3,0,1e-3", "0,0.3,1e-3",
                "0.3,0.3,1e-5", "0.3,0.3,1e-3", "0.5,0.3,1e-3", "0.3,0.5,1e-3",
                "0.3,0.3,3e-3"]


def org_upload_after_sensitive_read(context: str, history: list[str] | None) -> bool:
    """An upload to the org's own hosts (an HTTP POST / PUT, or mail to an org address)
    after the session read a file that holds credentials by convention: allowed by the
    stream's policy (the history rule is about data sent OUTSIDE), and the kind of call
    the pair term's history rule is most often wrong about (docs/learning.md, "Org uploads
    after a secret read"). Counted so an experiment shows what it does to them."""
    if not after_credential_read(history):
        return False
    tool, args = parse_call(context)
    upload = tool == "email.send" or (tool == "http.request"
                                      and args.get("method") in ("POST", "PUT"))
    return upload and destination_class(tool, args) == "org"


def replay(words: float, cross: float, l2: float, seed: int, n: int, switch_at: int,
           probes: int, points: tuple[int, ...], lag: int = 1, pair_rank: int = 0,
           pair_lr: float = 0.1, pool: float = 0.5, shapes: float = 0.0, lr: float = 0.5,
           pair_init: float = 0.1, veto: float = 0.0, pair_l2: float = -1.0,
           known: float = 0.0, sensitive: float = 0.0, egress: float = 0.0,
           pair_first: bool = False, block_only: bool = True, every: int = 0,
           correction_weight: float = 0.0, endpoints: float = 0.0,
           sql: float = 0.0, places: float = 0.0, hosts: bool = False,
           shared: bool = False, init_seed: int = 0, second_look: int = 0,
           pair_hold: float = 0.0, drift_relax: float = -1.0,
           drift_relax_pair: float = -1.0, drift_cap: float = 0.0,
           destination: float = 0.0, domains: float = 0.0,
           destination_share: float = 0.0, sensitive_places: bool = False,
           drift_withdraw_below: float | None = None, drift_waits: int | None = None,
           members: int = 1, drift_bag_all: int = 0,
           early_block: tuple[float, int] = (1.0, 0), call_places: bool = False,
           addresses: bool = False, early_looks: str = "both",
           bias: float | None = None, drift_shrink: float = 1.0,
           drift_contra: tuple[float, int, float, float, int] = (1.0, 0, 0.0, 1.0, 1),
           pair_history: int = 0, doubt: tuple[float, float] = NO_DOUBT,
           parts_at: int = 0, familiarity: float = 0.0,
           unscaled_adapting: int = 0, novel: float = 0.0, fresh_hosts: float = 0.0,
           look_now: str = "never", rule_blocks_pair_only: bool = False) -> dict:
    """One setting's run; `lag` > 1 scores each signal with weights that have not yet
    learned the previous `lag` - 1 (updates applied in groups of `lag`), as the daemon's
    trainer scores a step's arrivals with the weights published before them. `pair_rank`
    > 0 adds the call x history pair term (its tables initialised as the daemon's), its
    history keys pooled by `pool`; `shapes` is the argument shapes' norm, `lr` AdaGrad's
    rate for the linear weights and `pair_init` the pair tables' initial scale. `every` > 0
    also probes at every `every` signals (the daemon's checkpoints: how many of them reach
    0.90, in "curve"). `correction_weight` > 0 replaces a correction's weight (DESIGN.md
    section 2's 4.0, `label_weight`) in the wide path's step, not the anchor's.
    `endpoints`, `sql` and `places` are `ModelConfig.wide_endpoints`,
    `wide_sql_statements` and `wide_path_places`; `hosts` is `wide_shape_hosts` and `shared`
    `wide_pair_init_shared`; `init_seed` seeds the pair tables' init (the daemon's is its
    `daemon.seed`, bench_learning.py's the stream's). `second_look` > 0 learns every
    signal once more that many signals later under the newest label of its call, as the
    daemon's trainer does (`TrainConfig.wide_second_look`; 0 here by default, so the
    tables before "A second look" keep their commands); `pair_hold` > 0 holds the pair
    term's step on a first look's contradicted "allow" until that second look
    (`TrainConfig.wide_pair_hold`; 0 here by default, for the same reason).
    `drift_relax` >= 0 runs the daemon's drift detector (Page-Hinkley with the monitor's
    defaults, on the wide path's progressive errors against the signals' labels) and on
    an alarm does what the trainer's wide path does (`WidePath.on_drift`): the second looks
    from before the estimated change are dropped and AdaGrad's sums multiplied by
    `drift_relax` (`train.drift_wide_relax`); -1, the default: no detector, as before.
    `drift_withdraw_below` and `drift_waits` are the recheck's margin and waits
    (`train.drift_withdraw_below`, `train.drift_confirm_waits`; None: the daemon's
    defaults). `drift_relax_pair` >= 0 relaxes the pair term's sums by that instead; `drift_cap` > 0
    then caps the linear sums at that value (the most-seen features relaxed most).
    `destination` is `ModelConfig.wide_pair_destination` (0 here by default: the tables
    before "A destination on the pair term" keep their commands), `domains`
    `ModelConfig.wide_call_domains` (0 here by default, for the same reason),
    `destination_share` `ModelConfig.wide_pair_destination_share` (0 here by default, for
    the same reason), `sensitive_places` `ModelConfig.wide_sensitive_places` (off here by
    default, for the same reason), `members` `ModelConfig.wide_members` (1 here by
    default, for the same reason), `drift_bag_all` `train.drift_wide_bag_all` (the bag's
    members all learn that many examples after an alarm; 0 here by default, for the same
    reason), `drift_shrink` `train.drift_wide_shrink` (the linear weights' factor at an
    alarm, taken back if it is withdrawn; 1, off, here by default, for the same reason),
    `drift_contra` (`train.drift_wide_contra_relax`, `_examples`, `_margin`, `_decay`,
    `_decay_votes`: after an alarm a contradicting label relaxes its buckets' sums and
    decays the unsupported weights it pushes against; off here by default, for the same
    reason),
    `pair_history` `ModelConfig.wide_pair_history` (the newest entries the
    pair term reads; 0, every entry, here by default, for the same reason), `doubt`
    (`train.wide_doubt_weight`, `_logits`: an uncorrected second look's "allow" the pair
    term contradicts by more than the logits steps at the weight; off here by default,
    for the same reason), `familiarity` `ModelConfig.wide_familiarity` (the n-grams read
    scaled by their familiarity where a signal is scored or a probe asked; 0, off, here by
    default, for the same reason; read unscaled while the first `unscaled_adapting` of
    the learner's contradiction window's examples are learned,
    `train.drift_wide_unscaled_examples`), `parts_at` > 0:
    at the probes after that many signals also each feature group's part of the probes'
    logits (wide_parts.py `parts_table`), `early_block` (`train.wide_early_block_weight`,
    `_signals`: a block label's weight at the first signal and the signal where it has
    faded to 1; (1, 0), off, here by default, for the same reason), `call_places`
    `ModelConfig.wide_sensitive_call_places` (off here by default, for the same reason),
    `addresses` `ModelConfig.wide_endpoint_addresses` (off here by default, for the same
    reason), `novel` `ModelConfig.wide_novel_destinations` (the first-seen destination
    mark, read and learned as the daemon's wide learner does; 0, off, here by default,
    for the same reason),
    `fresh_hosts` the stream's `GatewayTraffic.fresh_hosts` (0: the stream as before),
    `look_now` when the second looks waiting from a policy change's estimated start on are
    taken at once (`train.drift_look_now`: "never", the schedule as before it; "alarm";
    "verdict", once the alarm is confirmed)."""
    cfg = dataclasses.replace(ModelConfig.preset("flint"), wide_call_words=words,
                              wide_history_cross=cross, wide_pair_rank=pair_rank,
                              wide_pair_pool=pool, wide_call_shapes=shapes,
                              wide_pair_init=pair_init, wide_pair_veto=veto,
                              wide_known_names=known, wide_sensitive_files=sensitive,
                              wide_egress_calls=egress, wide_pair_block_only=block_only,
                              wide_endpoints=endpoints, wide_sql_statements=sql,
                              wide_path_places=places, wide_shape_hosts=hosts,
                              wide_pair_init_shared=shared,
                              wide_pair_destination=destination,
                              wide_call_domains=domains,
                              wide_pair_destination_share=destination_share,
                              wide_sensitive_places=sensitive_places,
                              wide_members=members,
                              wide_sensitive_call_places=call_places,
                              wide_endpoint_addresses=addresses,
                              wide_pair_history=pair_history,
                              wide_novel_destinations=novel if domains else 0.0)
    if bias is not None:  # else the preset's (1)
        cfg = dataclasses.replace(cfg, wide_bias=bias)
    cfg = dataclasses.replace(cfg, wide_familiarity=familiarity)

    def feats(context: str, history: list[str] | None) -> tuple:
        b = source_batch([(context, history)], cfg)
        pair = tuple(b[k][0] for k in PAIR_KEYS) if pair_rank else None
        return (b["wide_idx"][0], b["wide_val"][0], 0.0, pair,
                int(b[NGRAM_END][0]) if NGRAM_END in b else None,
                int(b[NOVEL_AT][0]) if NOVEL_AT in b else -1)

    model = Model.init(cfg, seed=init_seed, dtype="float64")  # the wide slots, initialised
    wide = WideAdaGrad.for_model(model, np.zeros(model.num_params), lr=lr, l2=l2,
                                 pair_lr=pair_lr, pair_l2=None if pair_l2 < 0 else pair_l2,
                                 pair_first=pair_first,
                                 rule_blocks_pair_only=rule_blocks_pair_only)
    anchor = HashedNgramLR()
    stream = GatewayTraffic(seed=seed, fresh_hosts=fresh_hosts)
    probe_src = GatewayTraffic(seed=seed)
    right_w, right_a, at, pending, drifts = [], [], {}, [], []
    shrunk: dict[int, tuple] = {}  # a pending alarm's shrink, taken back if withdrawn
    org_uploads: list[tuple[bool, bool]] = []  # (gated right, anchor right)
    switch_ord = n
    look: SecondLook[tuple] = SecondLook(second_look)
    # the daemon's drift detector, its alarms rechecked after the corrections of its wait
    # (`Monitor.drift_check`); the verdicts go into "drifts"
    train = TrainConfig()  # the daemon's defaults
    detector = CheckedTest(PageHinkley(MonitorSettings.drift_delta,
                                       MonitorSettings.drift_threshold,
                                       MonitorSettings.drift_min_samples),
                           train.drift_confirm_signals,
                           train.drift_withdraw_below if drift_withdraw_below is None
                           else drift_withdraw_below,
                           train.drift_confirm_waits if drift_waits is None
                           else drift_waits) if drift_relax >= 0 else None

    def flush() -> None:
        for f_p, y_p, w_p, seq, fp, ordinary in pending:
            # the signal log's sequence numbers are 1-based
            wide.learn(*f_p[:3], y_p, w_p * early_block_weight(
                seq + 1, y_p, ordinary and early_looks != "second", *early_block),
                       f_p[3], pair_hold=pair_hold if look.delay else 0.0, novel_at=f_p[5])
            learn_looks(look.push(seq, fp, y_p, f_p, not ordinary), seq)
        pending.clear()

    def learn_looks(due, seq: int) -> None:  # the second looks due when signal `seq` came
        for f_l, y_l, corrected in due:
            wide.learn(*f_l[:3], y_l, early_block_weight(seq + 1, y_l, early_looks != "first",
                                                         *early_block),
                       f_l[3], doubt=NO_DOUBT if corrected else doubt, novel_at=f_l[5])

    def evidence_of(due) -> list[tuple]:  # as WidePath.on_drift gives `alarm_evidence`
        return [(f_l[0], f_l[1], y_l, f_l[5]) for f_l, y_l, _ in due]

    def z_of(events) -> np.ndarray:
        return np.array([z_of_one(feats(e.signal["context"], e.signal["history"]))
                         for e in events])

    def z_of_one(f) -> float:
        # as the model decides: `familiar_values`, not while adapting with `unscaled_adapting`
        unscaled = wide.in_window_first(unscaled_adapting)
        return wide.logit(*f[:3], f[3], None if unscaled else f[4], f[5])

    for i in range(n):
        if i == switch_at:
            stream.policy = probe_src.policy = "v2"
            switch_ord = len(right_w)  # ordinary signals scored before the change
        ev = stream.next()
        s = ev.signal
        f = feats(s["context"], s.get("history"))
        text = anchor_text(s["context"], s.get("history"))
        y, w = label_weight(s)
        fp = context_fingerprint(s["context"], s.get("history"))
        if detector is not None and ev.is_correction:
            detector.correct(fp, y < 0.5)
        if not ev.is_correction:
            z = z_of_one(f)
            right_w.append((z >= 0) == ev.true_allow)
            right_a.append((anchor.predict_proba(text) >= 0.5) == ev.true_allow)
            if ev.true_allow and org_upload_after_sensitive_read(s["context"], s.get("history")):
                org_uploads.append((right_w[-1], right_a[-1]))
            if detector is not None:
                began = detector.observe(i, fp, z < 0, y < 0.5, False)
                if began is not None:  # the trainer's on_drift, for the wide path
                    undo = adapt_to_drift(look, wide, began, drift_relax,
                                          None if drift_relax_pair < 0 else drift_relax_pair,
                                          drift_bag_all, drift_shrink, drift_contra)
                    if undo is not None:
                        shrunk[began] = undo
                    for learner in getattr(wide, "learners", [wide]) if drift_cap > 0 else []:
                        np.minimum(learner.g2, drift_cap, out=learner.g2)
                    drifts.append((i, began, None))
                    if look_now == "alarm":
                        due = look.take_from(began)
                        with wide.alarm_evidence(evidence_of(due)):  # as WidePath.on_drift
                            learn_looks(due, i)
                for b, confirmed in detector.take_verdicts():
                    adapt_to_drift_verdict(wide, shrunk.pop(b, None), confirmed)
                    if confirmed and look_now == "verdict":
                        due = look.take_from(b)
                        with wide.alarm_evidence(evidence_of(due)):
                            learn_looks(due, i)
                    k = next(j for j, d in enumerate(drifts) if d[1] == b and d[2] is None)
                    drifts[k] = (*drifts[k][:2], confirmed)
        look.note(fp, y, ev.is_correction)
        pending.append((f, y, correction_weight if correction_weight and ev.is_correction
                        else w, i, fp, not ev.is_correction))
        if len(pending) >= lag:
            flush()
        anchor.learn(text, y, w)
        if i + 1 in points or (every and (i + 1) % every == 0):
            flush()  # probes see everything streamed so far
            unseen = probe_src.probes(probes, seed + 1000)
            zu, yu = z_of(unseen), np.array([e.true_allow for e in unseen])
            hist = probe_src.history_probes(200, seed + 1001)
            zh, yh = z_of(hist), np.array([e.true_allow for e in hist])
            unseen_acc, recall, history = probe_figures(zu, yu, zh, yh)
            at[i + 1] = {"unseen": unseen_acc, "recall": recall,
                         "allow_prec": np.mean(yu[zu >= 0]),
                         "history": history,
                         "history_block": np.mean(zh[~yh] < 0),
                         "history_allow": np.mean(zh[yh] >= 0),
                         "typosquat": np.mean(zu[[e.category == "typosquat" for e in unseen]]
                                              < 0),
                         "offsets": offset_window(zu, yu, zh, yh)}
            if i + 1 == parts_at:
                at[i + 1]["parts"] = (parts_table(wide, cfg, unseen),
                                      parts_table(wide, cfg, hist))
    g = np.array([np.mean(right_w[j - CHECK:j]) for j in range(CHECK, len(right_w) + 1, CHECK)])
    a = np.array([np.mean(right_a[j - CHECK:j]) for j in range(CHECK, len(right_a) + 1, CHECK)])
    marks = [p for p in sorted(at) if every and p % every == 0]
    curve = {k: np.array([at[p][k] for p in marks]) for k in ("unseen", "recall", "history")}
    return {"ahead": int(np.sum(g > a)), "checks": len(g), "mean": float(np.mean(g - a)),
            "worst": float(np.min(g - a)), "first": float(g[0] - a[0]), "at": at,
            "behind": [(CHECK * (j + 1), g[j], a[j]) for j in np.flatnonzero(g <= a)],
            "curve": curve, "marks": marks, "drifts": drifts,
            "adapt": tuple(int(np.sum(~np.array(r[switch_ord:switch_ord + 250], bool)))
                           for r in (right_w, right_a)),
            "org_uploads": (len(org_uploads), sum(not g for g, _ in org_uploads),
                            sum(not a for _, a in org_uploads))}


def offset_window(zu: np.ndarray, yu: np.ndarray, zh: np.ndarray, yh: np.ndarray,
                  target: float = 0.90) -> tuple[float, float] | None:
    """The offsets t (0.05 apart, -3..3) at which deciding "allow" for z >= t puts the
    unseen-value probes, their block recall and the history rule all at `target` or more:
    (lowest, highest), or None where no offset does. Why: it says whether a checkpoint's
    miss is the decision's threshold (some offset meets all three) or the logits' order
    (none does), and how far apart the seeds' thresholds are (docs/learning.md, "Eight
    seeds at the doubt's code, and the first checkpoint's threshold")."""
    ok = [t for t in np.round(np.arange(-3.0, 3.0001, 0.05), 2)
          if min(probe_figures(zu, yu, zh, yh, t)) >= target]
    return (float(min(ok)), float(max(ok))) if ok else None


def probe_figures(zu: np.ndarray, yu: np.ndarray, zh: np.ndarray, yh: np.ndarray,
                  t: float = 0.0) -> tuple[float, float, float]:
    """The probes' three figures deciding "allow" for z >= `t`: the unseen-value probes'
    accuracy, their block recall, and the history rule's accuracy (TRUE labels `yu`,
    `yh`)."""
    return (np.mean((zu >= t) == yu), np.mean(zu[~yu] < t), np.mean((zh >= t) == yh))


def members_apart(probe: str, at: dict) -> str:
    """For the history rule, its two members apart (the block members' share blocked, the
    allow twins' share allowed): which one a checkpoint below 0.90 lost."""
    if probe != "history":
        return ""
    return f" (members {at['history_block']:.2f}, twins {at['history_allow']:.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", nargs="+", default=DEFAULT_GRID,
                    metavar="WORDS,CROSS,L2[,PAIR_RANK[,PAIR_LR[,POOL[,SHAPES[,LR[,INIT[,VETO"
                    "[,PAIR_L2[,KNOWN[,SENSITIVE[,EGRESS[,BLOCK[,ENDPOINTS[,SQL[,PLACES[,HOSTS[,SHARED"
                    "[,DEST[,DOMAINS[,DEST_SHARE[,MARK_PLACES[,MEMBERS]]]]]]]]]]]]]]]]]]]]]]")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--signals", type=int, default=12000)
    ap.add_argument("--switch-at", type=int, default=4000)
    ap.add_argument("--probes", type=int, default=1000)
    ap.add_argument("--lag", type=int, default=1, help="signals scored before learning")
    ap.add_argument("--every", type=int, default=0,
                    help="also probe every N signals and print, per row, at how many of those "
                         "checkpoints unseen values / their block recall / the history rule "
                         "reach 0.90, and their means, and the logit offsets at which all "
                         "three reach it at the first checkpoint (0: the two points only)")
    ap.add_argument("--pair-first", action=argparse.BooleanOptionalAction,
                    default=TrainConfig().wide_pair_first,
                    help="the pair term steps first (TrainConfig.wide_pair_first, the default; "
                         "--no-pair-first: the joint step)")
    ap.add_argument("--pair-owns-rule-blocks", action=argparse.BooleanOptionalAction,
                    default=False,
                    help="a block of an upload after a credential-file read steps the pair "
                         "term alone (TrainConfig.wide_pair_owns_rule_blocks, the daemon's "
                         "default; off here so the tables before it reproduce)")
    ap.add_argument("--init-seed", type=int, default=0,
                    help="seed of the wide path's init (its pair tables); -1: the stream's "
                         "seed, as bench_learning.py's daemon has it")
    ap.add_argument("--second-look", type=int, default=0,
                    help="the wide path's second look after N signals (the daemon's "
                         "train.wide_second_look; 0: none, as before it)")
    ap.add_argument("--pair-hold", type=float, default=0.0,
                    help="the pair term learns an 'allow' it contradicts by more than this "
                         "logit only at the second look (the daemon's train.wide_pair_hold; "
                         "0: off, as before it)")
    ap.add_argument("--drift-relax", type=float, default=-1.0,
                    help="run the daemon's drift detector and multiply the AdaGrad sums by "
                         "this at an alarm (train.drift_wide_relax; -1: no detector, as "
                         "before it)")
    ap.add_argument("--drift-relax-pair", type=float, default=-1.0,
                    help="the pair term's sums at an alarm (-1: --drift-relax's factor)")
    ap.add_argument("--drift-shrink", type=float, default=1.0,
                    help="with --drift-relax: multiply the linear weights by this at an "
                         "alarm, taken back if it is withdrawn (train.drift_wide_shrink; 1: "
                         "off, as before it)")
    ap.add_argument("--drift-contra", default="1:0:0", metavar="R:N:M[:D[:V]]",
                    help="with --drift-relax: for N examples after an alarm a label that "
                         "contradicts the wide logit by more than M multiplies its buckets' "
                         "sums by R, each bucket once, and the weights it pushes against "
                         "that nothing in the window supported by D from the V-th label "
                         "against them on (train.drift_wide_contra_relax, _examples, "
                         "_margin, _decay, _decay_votes; default 1:0:0, off, as before it; "
                         "D 1, V 1)")
    ap.add_argument("--drift-withdraw-below", type=float, default=None,
                    help="the drift recheck withdraws an alarm only at or under this share "
                         "of the threshold, else waits again (train.drift_withdraw_below; "
                         "default: the daemon's)")
    ap.add_argument("--drift-waits", type=int, default=None,
                    help="the recheck's waits in all (train.drift_confirm_waits; default: "
                         "the daemon's)")
    ap.add_argument("--drift-bag-all", type=int, default=0,
                    help="with a bag (grid field 25 > 1): every member learns this many "
                         "examples after an alarm (train.drift_wide_bag_all; 0: the draws "
                         "as always, as before it)")
    ap.add_argument("--early-block", default="1:0", metavar="W:N",
                    help="a block label of an ordinary signal weighs W at the first signal, "
                         "fading to 1 at signal N (train.wide_early_block_weight and "
                         "_signals; default 1:0, off, as before them)")
    ap.add_argument("--bias", type=float, default=None,
                    help="the wide path's bias feature's value (ModelConfig.wide_bias; "
                         "default: the preset's, 1; 0: none, docs/learning.md 'No bias in "
                         "the wide path')")
    ap.add_argument("--early-looks", choices=("both", "first", "second"), default="both",
                    help="which looks --early-block weighs: a signal's first look, its second "
                         "look, or both (the daemon's, the default)")
    ap.add_argument("--call-mark-places", action="store_true",
                    help="the call's own sensitive-file mark also with the file's place "
                         "(ModelConfig.wide_sensitive_call_places; default off, as before "
                         "it)")
    ap.add_argument("--endpoint-addresses", action="store_true",
                    help="the endpoint marks' kind 'address' for a token holding a public IP "
                         "address (ModelConfig.wide_endpoint_addresses; default off, as "
                         "before it)")
    ap.add_argument("--drift-cap", type=float, default=0.0,
                    help="at an alarm also cap the linear weights' AdaGrad sums at this "
                         "(0: no cap)")
    ap.add_argument("--pair-history", type=int, default=0,
                    help="the pair term reads only the newest N history entries "
                         "(ModelConfig.wide_pair_history; default 0, every entry, as before "
                         "it; the daemon's: 10)")
    ap.add_argument("--familiarity", type=float, default=0.0, metavar="POWER",
                    help="score and probe with the n-grams read scaled by f ** POWER, f "
                         "their familiarity (ModelConfig.wide_familiarity; default 0, off, "
                         "as before it)")
    ap.add_argument("--unscaled-adapting", type=int, default=0, metavar="N",
                    help="with --familiarity: read the n-grams unscaled while the first N "
                         "examples of the learner's contradiction window are learned "
                         "(train.drift_wide_unscaled_examples; default 0, off, as before it)")
    ap.add_argument("--novel", type=float, default=0.0, metavar="S",
                    help="the first-seen destination mark at S (ModelConfig."
                         "wide_novel_destinations; needs the domain key, grid field 22; "
                         "default 0, off, as before it; the daemon's default is 1)")
    ap.add_argument("--fresh-hosts", type=float, default=0.0, metavar="SHARE",
                    help="the share of the stream's outside hosts that are new "
                         "(GatewayTraffic.fresh_hosts; the probes are unchanged; default 0)")
    ap.add_argument("--doubt", default="1:0", metavar="WEIGHT:LOGITS",
                    help="a second look whose label is still the gate's 'allow' while the "
                         "pair term says 'block' by more than LOGITS steps at WEIGHT "
                         "(train.wide_doubt_weight, _logits; default 1:0, off, as before "
                         "it; the daemon's: 0.25:6)")
    ap.add_argument("--parts", type=int, default=0, metavar="N",
                    help="at the probes after N signals (a multiple of --every) also print "
                         "each feature group's part of the probes' wide logits, per tool, "
                         "TRUE category and verdict (bench/wide_parts.py; 0: not)")
    ap.add_argument("--look-now", choices=("never", "alarm", "verdict"), default="never",
                    help="take the second looks waiting from a policy change's estimated "
                         "start on at once: at the alarm, at its confirmed verdict, or never "
                         "(the schedule as before it, the default)")
    ap.add_argument("--correction-weight", type=float, default=0.0,
                    help="the wide path's weight of a correction (0: DESIGN.md's, 4.0)")
    a = ap.parse_args()
    r_, n_, m_, *d_ = a.drift_contra.split(":")
    contra = (float(r_), int(n_), float(m_), float(d_[0]) if d_ else 1.0,
              int(d_[1]) if len(d_) > 1 else 1)
    points = (a.switch_at - 500, a.signals - 500)
    print("| words | cross | l2 | pair rank, lr, pool | shapes | lr, init, veto, pair l2, known, "
          "sensitive, egress, block, endpoints, sql, places, hosts, shared | seed | "
          "ahead of anchor | "
          f"mean / worst / first diff | unseen @{points[0]} / @{points[1]} | block recall | "
          "allow precision | history rule | its block members / allow twins right | "
          "typosquats blocked |" + (f" every {a.every}: unseen >= 0.90, mean | block recall "
                                    "| history rule |" if a.every else ""))
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- "
          "| --- | --- | --- |" + (" --- | --- | --- |" if a.every else ""))
    for spec in a.grid:
        fields = [float(x) for x in spec.split(",")]
        words, cross, l2 = fields[:3]
        defaults = (0, 0.1, 0.5, 0.0, 0.5, 0.1, 0.0, -1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0,
                    0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
        (rank, pair_lr, pool, shapes, lr, init, veto, pair_l2, known, sens, egress, block,
         endpoints, sql, places, hosts, shared, dest, domains, dest_share, mark_places,
         members) = (fields[3 + k] if len(fields) > 3 + k else d
                     for k, d in enumerate(defaults))  # fields 4 to 25
        rank = int(rank)
        for seed in a.seeds:
            r = replay(words, cross, l2, seed, a.signals, a.switch_at, a.probes, points, a.lag,
                       rank, pair_lr, pool, shapes, lr, init, veto, pair_l2, known, sens,
                       egress, a.pair_first, bool(block), a.every, a.correction_weight,
                       endpoints, sql, places, bool(hosts), bool(shared),
                       seed if a.init_seed < 0 else a.init_seed, a.second_look, a.pair_hold,
                       a.drift_relax, a.drift_relax_pair, a.drift_cap, dest, domains,
                       dest_share, bool(mark_places), a.drift_withdraw_below,
                       a.drift_waits, int(members), a.drift_bag_all,
                       (float(a.early_block.split(":")[0]), int(a.early_block.split(":")[1])),
                       a.call_mark_places, a.endpoint_addresses, a.early_looks, a.bias,
                       a.drift_shrink, contra, a.pair_history,
                       tuple(float(x) for x in a.doubt.split(":")), a.parts, a.familiarity,
                       a.unscaled_adapting, a.novel, a.fresh_hosts, a.look_now,
                       a.pair_owns_rule_blocks)
            p0, p1 = (r["at"][p] for p in points)

            def pair(k: str, p0=p0, p1=p1) -> str:
                return f"{p0[k]:.3f} / {p1[k]:.3f}"
            print(f"| {words:g} | {cross:g} | {l2:g} | {rank}, {pair_lr:g}, {pool:g} | "
                  f"{shapes:g} | {lr:g}, {init:g}, {veto:g}, {pair_l2:g}, {known:g}, {sens:g}, "
                  f"{egress:g}, {block:g}, {endpoints:g}, {sql:g}, {places:g}, {hosts:g}, "
                  f"{shared:g}" + (f", {dest:g}" if dest or domains or dest_share or mark_places
                                       else "")
                  + (f", {domains:g}" if domains or dest_share or mark_places else "")
                  + (f", {dest_share:g}" if dest_share or mark_places else "")
                  + (f", {mark_places:g}" if mark_places else "") + " | "
                  f"{seed} | "
                  f"{r['ahead']}/{r['checks']} | "
                  f"{r['mean']:+.4f} / {r['worst']:+.3f} / {r['first']:+.3f} | {pair('unseen')} | "
                  f"{pair('recall')} | {pair('allow_prec')} | {pair('history')} | "
                  f"{pair('history_block')} ; {pair('history_allow')} | {pair('typosquat')} |"
                  + (" " + " | ".join(f"{np.sum(c >= 0.9)}/{len(c)}, {np.mean(c):.3f}"
                                      for c in r["curve"].values()) + " |" if a.every else ""),
                  flush=True)
            if a.every:  # where each probe is below 0.90: the checkpoints behind its count
                print("  below 0.90 at: " + "; ".join(
                    f"{name} " + (", ".join(f"{m:,} {v:.2f}{members_apart(name, r['at'][m])}"
                                            for m, v in zip(r["marks"], c, strict=True)
                                            if v < 0.9) or "none")
                    for name, c in zip(("unseen", "block recall", "history"),
                                       r["curve"].values(), strict=True))
                      + "; not ahead of the anchor at: " + (", ".join(
                          f"{m:,} {gm:.3f} / {am:.3f}" for m, gm, am in r["behind"]) or "none")
                      + ("; drift alarms (signal, change estimated at, verdict after "
                         "the corrections of the daemon's wait): " + (", ".join(
                             f"{i:,} ({b:,}, " + {True: "confirmed", False: "withdrawn",
                                                  None: "undecided"}[v] + ")"
                             for i, b, v in r["drifts"]) or "none")
                         if a.drift_relax >= 0 else "")
                      + "; errors in the first 250 after the change: {} / {} (anchor)".format(
                          *r["adapt"])
                      + "; org uploads after a credential-file read (TRUE allow), wrong: "
                        "{1} / {2} (anchor) of {0}".format(*r["org_uploads"])
                      + "; at the first checkpoint all three reach 0.90 deciding allow for z "
                        ">= t with t in: " + ("{:+.2f}..{:+.2f}".format(*w)
                                             if r["marks"] and
                                             (w := r["at"][r["marks"][0]]["offsets"])
                                             else "none"), flush=True)
            tables = r["at"].get(a.parts, {}).get("parts", ())  # none: no probes there
            for label, table in zip(("unseen-value probes", "history-rule probes"), tables,
                                    strict=False):
                print(f"\n  the wide logit's parts after {a.parts:,} signals, {label}:\n")
                print("\n".join(table) + "\n", flush=True)


if __name__ == "__main__":
    main()
