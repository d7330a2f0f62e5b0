"""Wide-path ideas measured in the harness and not kept: each wraps an engine function for
this process only, then runs bench_wide_features.py with the remaining arguments.

Why a wrapper and not a setting: a new `ModelConfig` field changes every state
directory's fingerprint (`ModelConfig.fingerprint` hashes every field), so even an option
left off would make every operator `--reinit`; an idea earns a field when it is kept.
The measurements: docs/learning.md, "A destination key, and holding the linear weights
too (measured 2026-11-25, eighth session; not kept)" (destination, allow-hold), "Five
more wide-path ideas, none kept" (shared-view, adagrad-init, ngram-scale, ema, pair-lr)
and "What the first checkpoints miss" (dest-cross); the destination key outside the
site's norm (``:outside``) was kept: "The wide path at a drift, and a destination on the
pair term" (now `ModelConfig.wide_pair_destination`, the harness's grid field 21), and
the domain key (``domain-key=0.3``) too: "A domain key" (now `ModelConfig.wide_call_domains`,
grid field 22; ``relax-part`` measured there, not kept); ``pair-egress``: "The pair term
only on uploads" (not kept); ``dest-unheld``, ``dest-allow-only`` and ``dest-cross`` again:
"Org uploads after a secret read" (not kept); ``held-weight``: "Seed 3's dip, step by step"
(not kept); ``bag-draw`` and ``bag-resync``: "The wide path as a bag" (the engine's
draws, `ModelConfig.wide_members` with grid field 25, kept); ``bag-repeat``: "Every member
learns after a drift alarm" (not kept; what was kept there is bench_wide_features.py's
``--drift-bag-all``); ``doubt`` and ``contra-spare``: "The pair term's window" (not
kept; what was kept there is bench_wide_features.py's ``--pair-history``).

    --experiment destination[:SCALE][:egress][:outside]
                               the pair term's call side gains ``p|dest|<domain>``: the
                               last two labels of the mail recipient's domain (``to``) or
                               of the URL's host (``url``), of value SCALE (default 1)
                               before the site's L2 normalisation, so an org-internal
                               POST or mail after a secret read can say "allow" through
                               its own factor; ``:egress``: only on calls that can carry
                               data out (known_names.py `egress_call`); ``:outside``:
                               appended after the site's normalisation (the site's keys
                               keep their values; the key only adds its factor)
    --experiment pair-egress=S the pair term's call side times S on a call that cannot
                               carry data out (0: the term is silent there and learns
                               nothing from it): allowed reads and commands after a
                               session read a secret no longer teach the secret's factor
                               "allow" along factors that start shared with the uploads'
    --experiment dest-cross=S  a linear feature ``xd|<destination>`` of value S on a call
                               that can carry data out after a history that read a
                               credential file: the history rule's conjunction per
                               destination, starting at 0 (unseen destinations say
                               nothing; the org's own learn "allow")
    --experiment domain-key=S[:tool][:only]
                               a linear feature ``d|<domain>`` of value S on every call
                               that names a destination (`call_destination`: a URL's host
                               or a mail recipient's domain, last two labels), whatever
                               its method (``:tool``: ``d|<tool>|<method>|<domain>`` too;
                               ``:only``: that one alone): an allow list works by domain,
                               and after a policy change that allows four domains and
                               blocks the rest the URL's words (``github``, ``com``,
                               diluted by the call's other words) were what said which
    --experiment relax-part=R:structured|ngrams
                               at a drift alarm (the harness's --drift-relax, which must
                               be 1) AdaGrad's sums of the linear weights are multiplied by
                               R only at the buckets the structured features (words,
                               shapes, marks, crosses: ``structured``) or the byte n-grams
                               (``ngrams``) have used: relaxing every sum adapted faster
                               and cost block recall on unseen values, the new policy's
                               first examples learned by their own n-grams more than by
                               the shapes an unseen value shares with them
    --experiment allow-hold=H  a first look's "allow" (weight 1: not a correction) that
                               the wide logit contradicts by more than H is not learned
                               at all until its second look (the pair term's hold,
                               `train.wide_pair_hold`, extended to the linear weights)
    --experiment shared-view=P[:words][:history]
                               every step of the linear weights is followed by a second
                               one, at P times the signal's weight, on the same signal
                               with its value-specific features left out: the call's byte
                               n-grams (``:words``: its argument words too; ``:history``:
                               the history's n-grams too). Why: a block category's first
                               examples are carried by their unique n-grams (AdaGrad's
                               first step on a fresh bucket is a full lr), so the features
                               an unseen value shares with them (shapes, marks, SQL verbs)
                               learn little; the second view makes them carry the label
                               alone, as dropout of the value features would
    --experiment adagrad-init=G0[:pair]
                               AdaGrad's squared-gradient sums of the linear weights start
                               at G0 instead of 0 (``:pair``: the pair tables' too): a
                               fresh bucket's first step is lr g / sqrt(G0 + g^2) rather
                               than a full lr whatever g, so the ~300 small-valued n-grams
                               of a call no longer each jump as far as a structured
                               feature of ten times their value
    --experiment sum-decay=RHO[:pair]
                               AdaGrad's squared-gradient sums of the linear weights forget:
                               G <- RHO G + g^2 at each step of a weight (``:pair``: the
                               pair tables' too), so a feature's step is sized by its recent
                               gradients, not by its first large ones: faster after a
                               policy change, and the gate's noise moves it as far
                               (docs/learning.md "The wide path's progress between
                               judgements, and two ideas not kept")
    --experiment drift-shrink=S[:pair]
                               at a drift alarm the wide path's linear weights (the pair
                               term's too with :pair) are multiplied by S
    --experiment ngram-scale=S the call's byte n-grams at S times their value (their
                               segment's L2 norm S instead of 1): AdaGrad's steps do not
                               depend on a feature's value, so this is their share of the
                               logit against the structured features, whose scales were
                               each tuned beside n-grams of norm 1 -- the n-grams a tool's
                               calls all share carry its "allow" prior (+1 .. +1.8 on the
                               held-out destructive queries and writes at 1,000 signals)
    --experiment ema=D         the harness scores (the progressive stream and the probes)
                               with an exponential moving average of the wide weights
                               (decay D per learning step: ~1/(1-D) steps, ~1.8 a signal)
                               while the learner steps the raw ones: online averaging
                               against the swings of single late checkpoints (a held-out
                               command allowed 20 of 20 at one checkpoint, 0 of 20 at the
                               next, docs/learning.md "An allow-listed host")
    --experiment pair-lr=LR:N  the pair term's AdaGrad rate is LR (the daemon's: 0.1) until
                               N signals have had their first look, then the daemon's:
                               a conjunction learned from the first dozen exfiltrations
                               starts from two small factors (init 0.1), whose product
                               grows slowly at first
    --experiment bag-draw=poisson|exp[:full0][:corrections]
                               with the engine's bag of K learners (grid field 25 = K):
                               every member learns each signal at k times its weight, k ~
                               Poisson(1) or Exp(1) (never 0) per member (the engine:
                               member 0 once, the others Poisson); ``:full0``: member 0
                               once; ``:corrections``: a correction is learned by every
                               member at least once
    --experiment bag-resync    with the engine's bag (grid field 25 > 1): at a drift
                               alarm every member restarts from member 0's tables and sums
    --experiment bag-repeat    with the engine's bag (grid field 25 > 1): a member that
                               draws k learns the signal k times at its weight (Oza and
                               Russell's "update k times") instead of once at k times it:
                               AdaGrad's sums then grow by k g^2 (E = 1 a signal, as
                               member 0's) instead of k^2 g^2 (E[k^2] = 2 for Poisson(1)),
                               so the drawn members do not step ~1/sqrt(2) as far
    --experiment hist-distance=S
                               every history entry the pair term reads gets a key of its
                               distance back, ``hd|<k>`` of value S, in its own group: a
                               secret read beyond the rule's window (11-12 calls back
                               in the stream, TRUE allow) can be told from one inside it
    --experiment mark-place[:only]
                               the sensitive-file mark on a history entry also names the
                               file's place (`path_place`: a project's ``.env`` in a home's
                               files, ``~/.ssh/id_rsa`` a home's dot entry, ``/etc/shadow``
                               the system): the engine's `wide_sensitive_places` (grid
                               field 24) forced on; ``:only``: instead of the plain mark
    --experiment held-weight=W a correction's first look (weight > 1) whose "allow" the pair
                               term contradicts (held from it: `train.wide_pair_hold`)
                               steps the linear weights at weight W instead of its own: a
                               rightful "allow" the term cannot explain (a secret read 11
                               calls back, one past the rule's window) moved every
                               exfiltration's call words toward "allow" at weight 4
    --experiment doubt=K[:H]   a second look's "allow" (the harness's learn without a pair
                               hold) that the pair term contradicts by more than H logits
                               (default 3, the daemon's `train.wide_pair_hold`) steps at K
                               times its weight: the pair term learns such an "allow" only
                               there, and one the gate got wrong and nobody corrected (an
                               exfiltration by e-mail, seed 7) moved every exfiltration
                               by e-mail +2 to +3 logits toward "allow"
    --experiment contra-spare=S
                               after a drift alarm the contradiction window
                               (`train.drift_wide_contra_relax`, the harness's
                               --drift-contra) does not relax the sums for an "allow"
                               that the pair term contradicts by more than S logits: the
                               history rule's block is not what a policy change flips
    --experiment dest-secret   the destination key only on a call after a credential-file
                               read (`with_dest_after_secret`), stepped as usual
    --experiment dest-unheld   the pair hold (`train.wide_pair_hold`) spares the pair
                               term's destination row: a held first-look "allow" also
                               steps the call side's ``p|dest|<domain>`` row at once
    --experiment dest-allow-only[:looks][:zero][:warm=N][:org][:secret]
                               the destination rows never step on a "block" label (put
                               back after the step), so a row can only learn "not the
                               history rule, here" and can be louder (grid field 21);
                               ``:looks``: a correction's or a second look's "block"
                               steps them as usual; ``:zero``: a destination's row is
                               zeroed when the features first name it (no initial factor);
                               ``:warm=N``: the rows do not step at all for the first N
                               signals' first looks; ``:org`` (an oracle, to measure
                               what outside hosts' rows cost): only the org's own
                               destinations' rows step, the others never;
                               ``:secret``: the key only on a call after a
                               credential-file read (`with_dest_after_secret`)

    .venv/bin/python bench/bench_wide_experiments.py --experiment destination -- \\
        --seeds 0 1 2 3 4 5 --signals 10000 --switch-at 4000 --every 500 --init-seed -1 \\
        --second-look 200 --pair-hold 3 \\
        --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,4,1,1,2,1,0.5,1,1
"""
from __future__ import annotations

import argparse
import sys
import weakref
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_wide_features  # noqa: E402

from gated.engine import tokenizer, wide, wide_pair  # noqa: E402
from gated.engine.known_names import egress_call, sensitive_file  # noqa: E402
from gated.engine.wide_learner import NO_DOUBT, WideAdaGrad, WideBag  # noqa: E402
from gated.traffic import destination_class  # noqa: E402


def destination(context: str) -> str | None:
    """Where a call sends to (engine/wide.py `call_destination`, which this experiment
    became: ModelConfig.wide_pair_destination)."""
    return wide.call_destination(wide._parse_call(context)[1])


def with_destination(pair_features, scale: float = 1.0, egress_only: bool = False,
                     outside_norm: bool = False):
    """`pair_features` with the destination key on the call side, of raw value `scale`
    (`egress_only`: only on calls that can carry data out, known_names.egress_call;
    `outside_norm`: appended after the site's L2 normalisation, so the site's own keys
    keep their full value and the key only adds to them)."""
    def features(context, history, buckets, sensitive_scale=0.0, egress_scale=0.0, *rest):
        c_idx, c_val, h_idx, h_val, h_grp = pair_features(context, history, buckets,
                                                           sensitive_scale, egress_scale,
                                                           *rest)
        dest = destination(context)
        if dest is None or (egress_only and not egress_call(*wide._parse_call(context))):
            return c_idx, c_val, h_idx, h_val, h_grp
        key = wide._bucket("p|dest|" + dest, buckets)
        if outside_norm:
            return np.r_[c_idx, key], np.r_[c_val, scale], h_idx, h_val, h_grp
        raw = np.r_[c_val / c_val[0], scale]  # the site's raw values: its tool key is 1.0
        return np.r_[c_idx, key], raw / np.linalg.norm(raw), h_idx, h_val, h_grp
    return features


def with_pair_egress(pair_features, scale: float):
    """`pair_features` with the call side's values times `scale` on a call that cannot
    carry data out (known_names.egress_call): at 0 the pair term is silent there and
    learns nothing from it. Why: the history rule is about uploads; every allowed
    ``fs.read`` or ``shell.exec`` after a session read its ``.env`` teaches the file's
    factor "allow" along that site's factor, which the shared initial factor carries over
    to the upload sites (seed 4: ``.env`` probes blocked 0 of 24 at 1,000 signals, after 11
    allowed calls and 1 exfiltration with a ``.env`` read in their history)."""
    def features(context, history, buckets, *rest):
        c_idx, c_val, h_idx, h_val, h_grp = pair_features(context, history, buckets, *rest)
        if egress_call(*wide._parse_call(context)):
            return c_idx, c_val, h_idx, h_val, h_grp
        return c_idx, c_val * scale, h_idx, h_val, h_grp
    return features


def with_dest_cross(structured_features, scale: float):
    """`structured_features` with one more linear feature, ``xd|<destination>`` of value
    `scale`, on a call that can carry data out (`egress_call`) after a history that read a
    credential file (`sensitive_file`): the history rule's own conjunction, per
    destination. A linear weight starts at 0, so a destination never seen says nothing
    (the pair term decides), while one seen after a secret read learns its side: the
    org's own hosts "allow", the paste sites "block"."""
    def features(context, history, buckets, *args):
        idx, val = structured_features(context, history, buckets, *args)
        tool, call_args = wide._parse_call(context)
        dest = destination(context)
        if dest is None or not egress_call(tool, call_args):
            return idx, val
        for entry in history or []:
            path = wide._parse_call(entry)[1].get("path")
            if isinstance(path, str) and sensitive_file(path):
                return (np.r_[idx, wide._bucket("xd|" + dest, buckets)], np.r_[val, scale])
        return idx, val
    return features


def with_domain_key(structured_features, scale: float, per_tool: bool, only_tool: bool):
    """`structured_features` with ``d|<domain>`` (and/or ``d|<tool>|<method>|<domain>``)
    of value `scale` on every call with a destination (`call_destination`)."""
    def features(context, history, buckets, *args):
        idx, val = structured_features(context, history, buckets, *args)
        tool, call_args = wide._parse_call(context)
        dest = wide.call_destination(call_args)
        if dest is None:
            return idx, val
        method = call_args.get("method") if isinstance(call_args.get("method"), str) else ""
        names = ([] if only_tool else [f"d|{dest}"]) + (
            [f"d|{tool}|{method}|{dest}"] if per_tool or only_tool else [])
        keys = [wide._bucket(n, buckets) for n in names]
        return np.r_[idx, keys], np.r_[val, [scale] * len(keys)]
    return features


#: the linear buckets each kind of feature has used, for relax-part
_USED: dict[str, set[int]] = {"structured": set(), "ngrams": set()}


def record_used() -> None:
    """Wrap the tokenizer's feature functions so that `_USED` collects their buckets."""
    ngrams, structured = tokenizer.wide_features, tokenizer.structured_features

    def wide_features(*args, **kw):
        idx, val = ngrams(*args, **kw)
        _USED["ngrams"].update(idx[1:].tolist())  # position 0 is the bias
        return idx, val

    def structured_features(*args, **kw):
        idx, val = structured(*args, **kw)
        _USED["structured"].update(idx.tolist())
        return idx, val

    tokenizer.wide_features, tokenizer.structured_features = wide_features, structured_features


def with_relax_part(relax, factor: float, part: str):
    """`WideAdaGrad.relax` that also multiplies the linear sums of `part`'s buckets by
    `factor` (the harness calls it with 1: the pair term and the rest stay)."""
    def relax_part(self, f, pair_factor=None):
        relax(self, f, pair_factor)
        used = np.fromiter(_USED[part], np.int64)
        self.g2[used] *= factor
    return relax_part


def with_allow_hold(learn, threshold: float, held: list[int]):
    """`WideAdaGrad.learn` that skips a contradicted first-look "allow" (counted in
    `held`); the harness passes `pair_hold` > 0 on first looks only."""
    def hold_or_learn(self, idx, val, z_rest, label, weight, pair=None, pair_hold=0.0,
                      doubt=NO_DOUBT):
        if pair_hold > 0 and label >= 0.5 and weight <= 1.0:
            z = self._gradient(idx, val, z_rest, label, weight, pair)["z"]
            if z < -threshold:
                held[0] += 1
                return z
        return learn(self, idx, val, z_rest, label, weight, pair, pair_hold, doubt)
    return hold_or_learn


def with_held_weight(learn, weight: float, held: list[int]):
    """`WideAdaGrad.learn` that gives a correction's held first-look "allow" (the pair term
    says "block" by more than the hold) `weight` (counted in `held`)."""
    def reweighted(self, idx, val, z_rest, label, w, pair=None, pair_hold=0.0,
                   doubt=NO_DOUBT):
        if pair_hold > 0 and label >= 0.5 and w > 1.0:
            if self._gradient(idx, val, z_rest, label, w, pair)["z_pair"] < -pair_hold:
                held[0] += 1
                w = weight
        return learn(self, idx, val, z_rest, label, w, pair, pair_hold, doubt)
    return reweighted


def with_doubt(learn, weight: float, threshold: float, doubted: list[int]):
    """`WideAdaGrad.learn` that gives a second look's "allow" (`pair_hold` 0 in the harness:
    its second looks, and replays, which it has none of) the weight `weight` times its own
    when the pair term says "block" by more than `threshold` (counted in `doubted`)."""
    def doubting(self, idx, val, z_rest, label, w, pair=None, pair_hold=0.0,
                 doubt=NO_DOUBT):
        if pair_hold == 0 and label >= 0.5 and pair is not None:
            if self._gradient(idx, val, z_rest, label, w, pair)["z_pair"] < -threshold:
                doubted[0] += 1
                w *= weight
        return learn(self, idx, val, z_rest, label, w, pair, pair_hold, doubt)
    return doubting


def with_contra_spare(relax_if_contradicted, threshold: float, spared: list[int]):
    """`WideAdaGrad._relax_if_contradicted` that spares an "allow" the pair term contradicts
    by more than `threshold` (it still counts as one of the window's examples)."""
    def spare_or_relax(self, st: dict, label: float) -> None:
        if label >= 0.5 and st["z_pair"] < -threshold:
            self.contra_left -= 1
            spared[0] += 1
            return
        relax_if_contradicted(self, st, label)
    return spare_or_relax


def with_destination_rows(pair_features, rows_seen: set, zero_table: list | None = None,
                          outside_rows: set | None = None):
    """`pair_features` that records in `rows_seen` the call-side row of every destination
    key it emits (``p|dest|<domain>`` on a call that can carry data out: the engine's own
    rule, re-hashed here, since the features do not mark which row is the destination's);
    with `zero_table` holding the call side's table, a row is zeroed when first named.
    With `outside_rows` (an oracle, for measuring only: the stream's own
    `traffic.destination_class`), the rows of destinations that are not the org's go there
    instead of `rows_seen`."""
    def features(context, history, buckets, sensitive_scale=0.0, egress_scale=0.0,
                 destination_scale=0.0, destination_rows=0):
        out = pair_features(context, history, buckets, sensitive_scale, egress_scale,
                            destination_scale, destination_rows)
        tool, args = wide._parse_call(context)
        dest = wide.call_destination(args) if destination_scale > 0 else None
        if dest is not None and egress_call(tool, args):
            row = wide_pair.destination_row(dest, buckets, destination_rows)
            into = rows_seen
            if outside_rows is not None and destination_class(tool, args) != "org":
                into = outside_rows
            if zero_table and row not in into:
                zero_table[0][row] = 0.0  # before the row's first use: it starts silent
            into.add(row)  # the same rows for every seed: the hash is the name's
        return out
    return features


def with_dest_after_secret(pair_features):
    """`pair_features` whose call side keeps its destination key (emitted last,
    `wide_pair.pair_features`) only when the history's pair keys hold a credential-file read
    (known_names.py `sensitive_file`, on the entries the pair term reads). Why: the key is
    there to say "not the history rule, here"; emitted on every upload, the org's row
    also takes the allows after ordinary reads, which otherwise teach the shared site
    factor what a harmless read looks like (the history probes' allow twins). With
    destination rows (`ModelConfig.wide_pair_destination_share`, which this experiment
    became) the engine does this itself, and the wrapper leaves the features alone."""
    def features(context, history, buckets, sensitive_scale=0.0, egress_scale=0.0,
                 destination_scale=0.0, destination_rows=0):
        c_idx, c_val, *rest = pair_features(context, history, buckets, sensitive_scale,
                                            egress_scale, destination_scale, destination_rows)
        tool, args = wide._parse_call(context)
        if (destination_scale > 0 and not destination_rows and egress_call(tool, args)
                and wide.call_destination(args) is not None
                and not after_secret(history)):
            c_idx, c_val = c_idx[:-1], c_val[:-1]
        return (c_idx, c_val, *rest)
    return features


def pair_entries(history) -> list[tuple[int, str, str]]:
    """(distance back, tool, path) of each history entry `wide_pair.pair_features` gives keys
    to, in its order: entry g of the result is its history group g (1: the newest entry)."""
    seen = (history or [])[-wide.MAX_STRUCTURED:]
    calls = [(len(seen) - i, *wide._parse_call(entry)) for i, entry in enumerate(seen)]
    return [(back, tool, args["path"]) for back, tool, args in calls
            if isinstance(args.get("path"), str) and args["path"]]


def with_hist_distance(pair_features, scale: float):
    """`pair_features` whose every history entry with pair keys also gets ``hd|<k>`` of
    value `scale`, k its distance back (1: the newest entry), in that entry's group: the
    soft minimum scores each entry with its distance's factor added, so a rule that looks
    only so far back can be learned per distance (a secret read 11 calls back, outside
    such a rule, no longer teaches the secret's factor "allow")."""
    def features(context, history, buckets, *rest):
        c_idx, c_val, h_idx, h_val, h_grp = pair_features(context, history, buckets, *rest)
        back = [b for b, _, _ in pair_entries(history)]
        groups = sorted(set(h_grp.tolist()))
        keys = [wide._bucket(f"hd|{back[g]}", buckets) for g in groups]
        return (c_idx, c_val, np.r_[h_idx, keys].astype(np.int64),
                np.r_[h_val, [scale] * len(keys)], np.r_[h_grp, groups].astype(np.int64))
    return features


def with_mark_place(pair_features, only: bool):
    """`pair_features` with the engine's placed sensitive mark on
    (`ModelConfig.wide_sensitive_places`, which this experiment measured before it was
    one: ``hf|fs.read|sensitive|home-files`` for a project's ``.env``, ``...|home-dot`` for
    ``~/.ssh/id_rsa``, ``...|system`` for ``/etc/shadow``), whatever the grid says; `only`:
    the plain mark ``hf|tool|sensitive`` dropped, so the placed one stands instead of it.
    Why: a read of a system key and a read of a project secret share the one mark, and
    when the rule counts only one of them the other's allows step the shared mark."""
    def features(context, history, buckets, sensitive_scale=0.0, egress_scale=0.0,
                 destination_scale=0.0, destination_rows=0, sensitive_places=False):
        out = pair_features(context, history, buckets, sensitive_scale, egress_scale,
                            destination_scale, destination_rows, True)
        if not only or sensitive_scale <= 0:
            return out
        c_idx, c_val, h_idx, h_val, h_grp = out
        keep = np.ones(len(h_idx), bool)
        for g, (_, tool, _) in enumerate(pair_entries(history)):
            plain = wide._bucket(f"hf|{tool}|sensitive", buckets)
            keep &= ~((h_grp == g) & (h_idx == plain) & (h_val == sensitive_scale))
        return c_idx, c_val, h_idx[keep], h_val[keep], h_grp[keep]
    return features


def after_secret(history) -> bool:
    """Whether an entry the pair term reads (the last MAX_STRUCTURED) reads a file that
    holds credentials by convention."""
    for entry in (history or [])[-wide.MAX_STRUCTURED:]:
        path = wide._parse_call(entry)[1].get("path")
        if isinstance(path, str) and path and sensitive_file(path):
            return True
    return False


def _rows_in(rows: np.ndarray, rows_seen: set) -> np.ndarray:
    """Which of `rows` are destination rows (a boolean mask)."""
    return np.isin(rows, np.fromiter(rows_seen, np.int64, len(rows_seen)))


def with_dest_unheld(learn, rows_seen: set, steps: list[int]):
    """`WideAdaGrad.learn` whose pair hold spares the destination key's row (`rows_seen`,
    recorded by `with_destination_rows`): a first-look "allow" the pair term contradicts
    still steps the linear weights only, and now also the call side's ``p|dest|<domain>``
    row. Why: an upload to the org's own host after a secret read is allowed, the pair
    term says "block" by more than the hold, and only the destination's own factor can
    say "not this rule, here" without touching what the term learned about secrets and
    uploads; held, it learns that only at second looks (org uploads after a secret-like
    read: gated wrong on ~40% of them in the first 7,000 signals of the daemon's traces,
    the anchor on ~2%)."""
    def learn_dest(self, idx, val, z_rest, label, weight, pair=None, pair_hold=0.0,
                   doubt=NO_DOUBT):
        if pair is None or pair_hold <= 0 or label < 0.5 or self.pair is None:
            return learn(self, idx, val, z_rest, label, weight, pair, pair_hold, doubt)
        st = self._gradient(idx, val, z_rest, label, weight, pair)
        z = learn(self, idx, val, z_rest, label, weight, pair, pair_hold, doubt)
        if st["z_pair"] < -pair_hold and st["pair"]:
            rows, g, now = st["pair"][0]
            keep = _rows_in(rows, rows_seen)
            if keep.any():
                steps[0] += 1
                self._step(self.pair[0], self.pair[1], self.xp.asarray(rows[keep]),
                           now[keep], g[keep], self.pair_lr)
        return z
    return learn_dest


def with_dest_allow_only(learn, rows_seen: set, kept: list[int], looks: bool = False,
                         zero_table: list | None = None, warm_up: int = 0,
                         outside_rows: set | None = None):
    """`WideAdaGrad.learn` under which the destination key's rows (`rows_seen`, recorded
    by `with_destination_rows`) never step on a "block" label: their weights and
    sums are put back after the step. Why: the key is there to silence the history rule
    for the org's own hosts; stepped on blocks too, an outside host's row takes a share
    of every exfiltration to it, so the rule is learned per destination and an unseen
    host gets less of it (the key at 1.0 cost block recall on unseen values:
    docs/learning.md, "A destination on the pair term"); allowed-only, a row can only
    learn "not the rule, here", and can be louder. `looks`: a "block" that is a correction
    (weight > 1) or a second look (the harness passes no hold then) steps the rows as
    usual, so what a wrong "allow" of the gate taught a destination is taken back.
    `outside_rows` (the ``:org`` oracle, `with_destination_rows`): rows that never step."""
    firsts, tables = [0], []
    learn = with_rows_still(learn, outside_rows) if outside_rows is not None else learn

    def learn_allow_only(self, idx, val, z_rest, label, weight, pair=None, pair_hold=0.0,
                         doubt=NO_DOUBT):
        if self.pair is not None and (not tables or tables[0] is not self.pair[0]):
            # a new learner (the harness runs its seeds one after another in one process)
            tables[:] = [self.pair[0]]
            firsts[0] = 0
            if zero_table is not None:
                zero_table[:] = [self.pair[0]]
                named = rows_seen | (outside_rows or set())
                known = np.fromiter(named, np.int64, len(named))
                self.pair[0][known] = 0.0  # the rows named before this learner's first step
        firsts[0] += pair_hold > 0  # the harness marks first looks by their hold
        frozen = firsts[0] <= warm_up
        if looks and (weight > 1.0 or pair_hold <= 0) and not frozen:
            return learn(self, idx, val, z_rest, label, weight, pair, pair_hold, doubt)
        if pair is None or (label >= 0.5 and not frozen) or self.pair is None or not rows_seen:
            return learn(self, idx, val, z_rest, label, weight, pair, pair_hold, doubt)
        c = np.asarray(pair[0])[np.asarray(pair[1]) != 0]
        rows = c[_rows_in(c, rows_seen)]
        if not len(rows):
            return learn(self, idx, val, z_rest, label, weight, pair, pair_hold, doubt)
        d_rows = self.xp.asarray(rows)
        saved = self.pair[0][d_rows].copy(), self.pair[1][d_rows].copy()
        z = learn(self, idx, val, z_rest, label, weight, pair, pair_hold, doubt)
        self.pair[0][d_rows], self.pair[1][d_rows] = saved
        kept[0] += 1
        return z
    return learn_allow_only


def with_rows_still(learn, still: set):
    """`WideAdaGrad.learn` that leaves the call side's rows in `still` as they were."""
    def learn_still(self, idx, val, z_rest, label, weight, pair=None, pair_hold=0.0,
                    doubt=NO_DOUBT):
        if pair is None or self.pair is None or not still:
            return learn(self, idx, val, z_rest, label, weight, pair, pair_hold, doubt)
        c = np.asarray(pair[0])[np.asarray(pair[1]) != 0]
        rows = self.xp.asarray(c[_rows_in(c, still)])
        saved = self.pair[0][rows].copy(), self.pair[1][rows].copy()
        z = learn(self, idx, val, z_rest, label, weight, pair, pair_hold, doubt)
        self.pair[0][rows], self.pair[1][rows] = saved
        return z
    return learn_still


def call_ngrams(ids, segs, n_max: int, buckets: int) -> int:
    """How many n-gram features the call (segment 0) has: `wide.wide_features` lists them
    right after the bias, before the history's."""
    call = np.asarray(ids, np.uint64)[np.asarray(segs) == 0]
    return len(wide._segment_features(call, 0, n_max, buckets)[0])


#: the kept positions of the shared view, per wide feature row (keyed by its bucket ids)
_SHARED_VIEW: dict[bytes, np.ndarray] = {}
_LAST: dict[str, int] = {}


def record_parts(words: bool, history: bool) -> None:
    """Wrap the tokenizer's feature functions so that each single-row `source_batch`
    registers which of its wide features the shared view keeps (`_SHARED_VIEW`)."""
    ngrams, structured, batch = (tokenizer.wide_features, tokenizer.structured_features,
                                 bench_wide_features.source_batch)

    def wide_features(ids, segs, n_max, buckets, history_scale=1.0):
        idx, val = ngrams(ids, segs, n_max, buckets, history_scale)
        _LAST["call"] = call_ngrams(ids, segs, n_max, buckets)
        _LAST["ngrams"] = len(idx)
        return idx, val

    def structured_features(context, history, buckets, word_scale, *rest):
        out = structured(context, history, buckets, word_scale, *rest)
        _LAST["words"] = (len(structured(context, None, buckets, word_scale, 0.0)[0])
                          if word_scale > 0 else 0)
        return out

    def source_batch(items, cfg):
        b = batch(items, cfg)
        if len(items) == 1:
            keep = np.ones(b["wide_idx"].shape[1], bool)
            keep[1: 1 + _LAST["call"]] = False  # the bias (position 0) stays
            if history:
                keep[1 + _LAST["call"]: _LAST["ngrams"]] = False
            if words:  # structured_features puts the argument words first
                keep[_LAST["ngrams"]: _LAST["ngrams"] + _LAST.get("words", 0)] = False
            if len(_SHARED_VIEW) > 50_000:  # second looks come 200 signals later
                _SHARED_VIEW.pop(next(iter(_SHARED_VIEW)))
            _SHARED_VIEW[b["wide_idx"][0].tobytes()] = keep
        return b

    tokenizer.wide_features, tokenizer.structured_features = wide_features, structured_features
    bench_wide_features.source_batch = source_batch


def with_shared_view(learn, share: float, steps: list[int]):
    """`WideAdaGrad.learn`, then a step of the linear weights alone on the signal's shared
    view at `share` times its weight (the pair term in the logit, held still)."""
    def learn_then_view(self, idx, val, z_rest, label, weight, pair=None, pair_hold=0.0,
                        doubt=NO_DOUBT):
        z = learn(self, idx, val, z_rest, label, weight, pair, pair_hold, doubt)
        keep = _SHARED_VIEW.get(np.asarray(idx).tobytes())
        if keep is not None:
            st = self._gradient(np.asarray(idx)[keep], np.asarray(val)[keep], z_rest, label,
                                share * weight, pair)
            self._step(self.w, self.g2, st["d_idx"], st["w_now"], st["g"], self.lr)
            steps[0] += 1
        return z
    return learn_then_view


def with_adagrad_init(step, g0: float, pair: bool):
    """`WideAdaGrad._step` whose sums read as G0 more than they hold (the linear table's;
    the pair tables' too with `pair`): the same as starting them at G0."""
    def step_from_g0(self, table, sums, d_idx, now, g, lr):
        if table is not self.w and not pair:
            return step(self, table, sums, d_idx, now, g, lr)
        g2 = self._host(sums[d_idx]).astype(np.float64) + g * g
        sums[d_idx] = self.xp.asarray(g2, dtype=sums.dtype)
        table[d_idx] = self.xp.asarray(now - lr * g / (np.sqrt(g0 + g2) + self.eps),
                                       dtype=table.dtype)
    return step_from_g0


def with_sum_decay(step, rho: float, pair: bool):
    """`WideAdaGrad._step` whose squared-gradient sums forget: G <- rho G + g^2 at every
    step of a weight (the linear table's; the pair tables' too with `pair`), RMSprop's
    sums kept per touch. Why: AdaGrad's sums are dominated by the first, large gradients
    of a feature, so after thousands of confident signals a feature's step is still sized
    by them, and a policy change that contradicts it moves it slowly; forgotten sums
    size the step by recent gradients, small while the feature is right."""
    def decayed_step(self, table, sums, d_idx, now, g, lr):
        if table is not self.w and not pair:
            return step(self, table, sums, d_idx, now, g, lr)
        g2 = rho * self._host(sums[d_idx]).astype(np.float64) + g * g
        sums[d_idx] = self.xp.asarray(g2, dtype=sums.dtype)
        table[d_idx] = self.xp.asarray(now - lr * g / (np.sqrt(g2) + self.eps),
                                       dtype=table.dtype)
    return decayed_step


def with_drift_shrink(relax, factor: float, pair: bool):
    """`WideAdaGrad.relax` (what a drift alarm calls) that also multiplies the linear
    weights (`WideAdaGrad.shrink`, never taken back; the pair tables' too with `pair`) by
    `factor`. Why: after a policy change
    the features the old policy made confident (+2..+4 logits on calls v2 blocks) need
    many contradicting steps; shrunk, every decision keeps its sign but the new policy's
    first examples outweigh them sooner."""
    def relax_and_shrink(self, f, pair_factor=None):
        relax(self, f, pair_factor)
        self.shrink(factor)  # (no undo here: what it returns is dropped)
        if pair and self.pair is not None:
            self.pair[0][...] *= factor
            self.pair[2][...] *= factor
    return relax_and_shrink


def with_ngram_scale(wide_features, scale: float):
    """`wide.wide_features` with the call segment's n-gram values times `scale`."""
    def scaled(ids, segs, n_max, buckets, history_scale=1.0, bias=1.0):
        idx, val = wide_features(ids, segs, n_max, buckets, history_scale, bias)
        n_call = call_ngrams(ids, segs, n_max, buckets)
        val = val.copy()
        head = 1 if bias else 0  # the bias, when there is one, comes first
        val[head: head + n_call] *= scale
        return idx, val
    return scaled


def with_ema(learn, gradient, decay: float):
    """(`learn` that updates an average of the wide tables after each step, `gradient` that
    scores with the average): the harness scores through `WideAdaGrad.gradient` only."""
    avg: dict[int, list] = {}

    def tables(self) -> list:
        return [self.w] + ([self.pair[0], self.pair[2]] if self.pair is not None else [])

    def learn_then_average(self, *args, **kw):
        z = learn(self, *args, **kw)
        if id(self) not in avg:
            avg[id(self)] = [t.copy() for t in tables(self)]
        for mean, now in zip(avg[id(self)], tables(self), strict=True):
            mean *= decay
            mean += (1.0 - decay) * now
        return z

    def gradient_of_average(self, *args, **kw):
        if id(self) not in avg:
            return gradient(self, *args, **kw)
        raw = self.w, self.pair
        means = avg[id(self)]
        self.w = means[0]
        if self.pair is not None:
            self.pair = (means[1], self.pair[1], means[2], self.pair[3])
        try:
            return gradient(self, *args, **kw)
        finally:
            self.w, self.pair = raw
    return learn_then_average, gradient_of_average


def with_pair_lr(learn, early_lr: float, until: int):
    """`WideAdaGrad.learn` at pair rate `early_lr` for the first `until` first looks (the
    harness marks a first look by its pair hold > 0), counted per learner: until
    2026-11-28 one count ran on across the seeds the harness replays in one process, so
    only the first seed of a run had the early rate."""
    first_looks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def learn_at_rate(self, idx, val, z_rest, label, weight, pair=None, pair_hold=0.0,
                      doubt=NO_DOUBT):
        first_looks[self] = first_looks.get(self, 0) + (pair_hold > 0)
        rate = self.pair_lr
        self.pair_lr = early_lr if first_looks[self] <= until else rate
        try:
            return learn(self, idx, val, z_rest, label, weight, pair, pair_hold, doubt)
        finally:
            self.pair_lr = rate
    return learn_at_rate


def with_bag_draws(draw: str, full_first: bool, every_correction: bool):
    """`WideBag._times` with other draws than the engine's (member 0 once, the others
    Poisson(1)): ``draw`` "poisson" or "exp" for every member from generator 7919 + m
    (Exp(1) is the Bayesian bootstrap: mean and variance 1 as Poisson(1), never 0, so no
    member skips a rare block outright); ``full_first``: member 0 once, as the engine;
    ``every_correction``: a correction (weight > 1) is learned by every member at least
    once. The engine's bag (grid field 25) is what it redraws."""
    draws: dict[int, list] = {}

    def times(self, weight: float) -> list[float]:
        rngs = draws.setdefault(id(self), [np.random.default_rng(WideBag.SEED + m)
                                           for m in range(len(self.learners))])
        ks = [float(r.poisson(1.0) if draw == "poisson" else r.exponential(1.0))
              for r in rngs]
        if full_first:
            ks[0] = 1.0
        return [max(k, 1.0) for k in ks] if every_correction and weight > 1.0 else ks
    return times


def with_bag_resync(relax):
    """`WideBag.relax` that, after relaxing, copies member 0's tables and AdaGrad sums into
    every other member: at a drift alarm the bag restarts from its full learner, which has
    learned the new policy's first signals at full weight, instead of averaging it with
    members that drew fewer of them."""
    def relax_then_resync(self, factor, pair_factor=None):
        relax(self, factor, pair_factor)
        first, *rest = self.learners
        for learner in rest:
            learner.w[...], learner.g2[...] = first.w, first.g2
            if first.pair is not None:
                for mine, its in zip(learner.pair, first.pair, strict=True):
                    mine[...] = its
    return relax_then_resync


def bag_learn_repeated(self, idx, val, z_rest, label, weight, pair=None, pair_hold=0.0,
                       doubt=NO_DOUBT):
    """`WideBag.learn` where a member that draws k learns the signal k times at its weight
    (an integer k: Poisson draws) instead of once at k times it."""
    z = 0.0
    for learner, k in zip(self.learners, self._times(weight), strict=True):
        z += learner.logit(idx, val, z_rest, pair)
        for _ in range(int(round(k))):
            learner.learn(idx, val, z_rest, label, weight, pair, pair_hold, doubt)
    return z / len(self.learners)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", required=True, action="append",
                    help="destination[:SCALE][:egress], dest-cross=S, allow-hold=H, ... "
                         "(repeatable; the list above)")
    ap.add_argument("rest", nargs=argparse.REMAINDER,
                    help="-- then bench_wide_features.py's arguments")
    a = ap.parse_args()
    held, views, dest_steps, kept, reweighted, doubted, spared = ([0] for _ in range(7))
    dest_rows: set[int] = set()
    for exp in a.experiment:
        if exp.startswith("destination"):  # destination[:SCALE][:egress][:outside]
            opts = exp.split(":")[1:]
            scale = next((float(o) for o in opts if o not in ("egress", "outside")), 1.0)
            tokenizer.pair_features = with_destination(tokenizer.pair_features, scale,
                                                       "egress" in opts, "outside" in opts)
        elif exp.startswith("pair-egress="):
            tokenizer.pair_features = with_pair_egress(tokenizer.pair_features,
                                                       float(exp.split("=", 1)[1]))
        elif exp.startswith("dest-cross="):
            tokenizer.structured_features = with_dest_cross(tokenizer.structured_features,
                                                            float(exp.split("=", 1)[1]))
        elif exp.startswith("domain-key="):  # domain-key=S[:tool][:only]
            scale, *opts = exp.split("=", 1)[1].split(":")
            tokenizer.structured_features = with_domain_key(
                tokenizer.structured_features, float(scale), "tool" in opts, "only" in opts)
        elif exp.startswith("relax-part="):  # relax-part=R:structured|ngrams
            factor, part = exp.split("=", 1)[1].split(":")
            if part not in _USED:
                ap.error(f"relax-part=R:structured or R:ngrams, not {part!r}")
            record_used()
            WideAdaGrad.relax = with_relax_part(WideAdaGrad.relax, float(factor), part)
        elif exp.startswith("allow-hold="):
            WideAdaGrad.learn = with_allow_hold(WideAdaGrad.learn,
                                                float(exp.split("=", 1)[1]), held)
        elif exp.startswith("held-weight="):
            WideAdaGrad.learn = with_held_weight(WideAdaGrad.learn,
                                                 float(exp.split("=", 1)[1]), reweighted)
        elif exp.startswith("doubt="):  # doubt=K[:H]
            k, *h = exp.split("=", 1)[1].split(":")
            WideAdaGrad.learn = with_doubt(WideAdaGrad.learn, float(k),
                                           float(h[0]) if h else 3.0, doubted)
        elif exp.startswith("contra-spare="):
            WideAdaGrad._relax_if_contradicted = with_contra_spare(
                WideAdaGrad._relax_if_contradicted, float(exp.split("=", 1)[1]), spared)
        elif exp.startswith("shared-view="):  # shared-view=P[:words][:history]
            share, *opts = exp.split("=", 1)[1].split(":")
            record_parts("words" in opts, "history" in opts)
            WideAdaGrad.learn = with_shared_view(WideAdaGrad.learn, float(share), views)
        elif exp.startswith("adagrad-init="):  # adagrad-init=G0[:pair]
            g0, *opts = exp.split("=", 1)[1].split(":")
            WideAdaGrad._step = with_adagrad_init(WideAdaGrad._step, float(g0), "pair" in opts)
        elif exp.startswith("sum-decay="):  # sum-decay=RHO[:pair]
            rho, *opts = exp.split("=", 1)[1].split(":")
            WideAdaGrad._step = with_sum_decay(WideAdaGrad._step, float(rho), "pair" in opts)
        elif exp.startswith("drift-shrink="):  # drift-shrink=S[:pair]
            factor, *opts = exp.split("=", 1)[1].split(":")
            WideAdaGrad.relax = with_drift_shrink(WideAdaGrad.relax, float(factor),
                                                  "pair" in opts)
        elif exp.startswith("ngram-scale="):
            tokenizer.wide_features = with_ngram_scale(tokenizer.wide_features,
                                                       float(exp.split("=", 1)[1]))
        elif exp.startswith("ema="):
            WideAdaGrad.learn, WideAdaGrad.gradient = with_ema(
                WideAdaGrad.learn, WideAdaGrad.gradient, float(exp.split("=", 1)[1]))
        elif exp.startswith("dest-allow-only"):  # :looks :zero :warm=N :org :secret
            table: list = [] if ":zero" in exp else None
            warm = next((int(o[5:]) for o in exp.split(":") if o.startswith("warm=")), 0)
            outside: set[int] | None = set() if ":org" in exp else None
            if ":secret" in exp:
                tokenizer.pair_features = with_dest_after_secret(tokenizer.pair_features)
            tokenizer.pair_features = with_destination_rows(tokenizer.pair_features,
                                                            dest_rows, table, outside)
            WideAdaGrad.learn = with_dest_allow_only(WideAdaGrad.learn, dest_rows, kept,
                                                     ":looks" in exp, table, warm, outside)
        elif exp.startswith("hist-distance="):
            tokenizer.pair_features = with_hist_distance(tokenizer.pair_features,
                                                         float(exp.split("=", 1)[1]))
        elif exp.startswith("mark-place"):  # mark-place[:only]
            tokenizer.pair_features = with_mark_place(tokenizer.pair_features,
                                                      exp.endswith(":only"))
        elif exp == "dest-secret":
            tokenizer.pair_features = with_dest_after_secret(tokenizer.pair_features)
        elif exp == "dest-unheld":
            tokenizer.pair_features = with_destination_rows(tokenizer.pair_features,
                                                            dest_rows)
            WideAdaGrad.learn = with_dest_unheld(WideAdaGrad.learn, dest_rows, dest_steps)
        elif exp.startswith("bag-draw="):  # bag-draw=poisson|exp[:full0][:corrections]
            draw, *opts = exp.split("=", 1)[1].split(":")
            if draw not in ("poisson", "exp"):
                ap.error(f"bag-draw=poisson or exp, not {draw!r}")
            WideBag._times = with_bag_draws(draw, "full0" in opts, "corrections" in opts)
        elif exp == "bag-resync":  # with the engine's bag (grid field 25 > 1)
            WideBag.relax = with_bag_resync(WideBag.relax)
        elif exp == "bag-repeat":  # with the engine's bag (grid field 25 > 1)
            WideBag.learn = bag_learn_repeated
        elif exp.startswith("pair-lr="):  # pair-lr=LR:N
            early, until = exp.split("=", 1)[1].split(":")
            WideAdaGrad.learn = with_pair_lr(WideAdaGrad.learn, float(early), int(until))
        else:
            ap.error(f"unknown experiment {exp!r}: destination[:SCALE][:egress], dest-cross=S, "
                     "pair-egress=S, "
                     "domain-key=S[:tool][:only], relax-part=R:PART, "
                     "allow-hold=H, held-weight=W, doubt=K[:H], contra-spare=S, "
                     "shared-view=P[:words][:history], "
                     "adagrad-init=G0[:pair], sum-decay=RHO[:pair], drift-shrink=S[:pair], "
                     "ngram-scale=S, ema=D, pair-lr=LR:N, bag-draw=..., bag-resync, "
                     "bag-repeat, dest-secret, dest-unheld or "
                     "dest-allow-only[:looks][:zero][:warm=N][:org][:secret]")
    rest = a.rest[1:] if a.rest[:1] == ["--"] else a.rest
    pair_hold = float(rest[rest.index("--pair-hold") + 1]) if "--pair-hold" in rest else 0.0
    if (any(e.startswith(("allow-hold=", "pair-lr=", "held-weight=")) for e in a.experiment)
            and pair_hold <= 0):
        ap.error("allow-hold, pair-lr and held-weight count first looks, which the harness "
                 "marks by its pair hold: pass --pair-hold H (> 0) too")
    print(f"experiments: {', '.join(a.experiment)}", flush=True)
    sys.argv = [sys.argv[0], *rest]
    bench_wide_features.main()
    if held[0]:
        print(f"first-look allows held from the linear weights: {held[0]}")
    if reweighted[0]:
        print(f"held corrections stepped at the experiment's weight: {reweighted[0]}")
    if views[0]:
        print(f"shared-view steps: {views[0]}")
    if doubted[0]:
        print(f"second-look allows stepped at the doubt's weight (per member): {doubted[0]}")
    if spared[0]:
        print(f"contradicting allows the relax spared (per member): {spared[0]}")
    if dest_steps[0]:
        print(f"held allows that stepped their destination's row: {dest_steps[0]}")
    if kept[0]:
        print(f"blocks that left their destination's row as it was: {kept[0]}")


if __name__ == "__main__":
    main()
