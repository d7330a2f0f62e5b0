"""The wide path's schedule inside the trainer: what it learns from each fresh signal, when,
and under which label.

The learner (engine/wide_learner.py `WideAdaGrad`) steps one signal at a time; this is
the order and the labels the trainer gives it: every fresh signal at once (first look),
replayed examples interleaved when `train.wide_replay` asks for them, and a second look at
each signal `train.wide_second_look` signals later under the newest label of its call
(online/second_look.py). The transformer's step and the publication of the weights are the
trainer's (loop.py, publication.py); this module only moves the wide slots of the training
weights.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...config import TrainConfig
from ...engine import Model
from ...engine.wide import NOVEL_AT, PAIR_KEYS
from ...engine.wide_learner import NO_DOUBT, WideAdaGrad, WideBag
from ...online.second_look import DueLook, SecondLook
from ...signals import CORRECTIONS

#: `n` -> (replayed examples, their `source_batch`): what the trainer's reservoir gives
#: the wide path to learn again (loop.py `Trainer._wide_replay`; nothing for `n` <= 0)
DrawReplay = Callable[[int], tuple[list[dict], dict]]


class WidePath:
    """`learner` (None when the model has no wide path) and its schedule; `dirty` says that
    the wide weights changed since the trainer last published them."""

    def __init__(self, settings: TrainConfig) -> None:
        self.learner: WideAdaGrad | None = None
        #: the second look at each signal the wide path learned
        self.second_look: SecondLook[tuple] = SecondLook(settings.wide_second_look)
        self.dirty = False
        #: began seq of each drift alarm awaiting its verdict -> what takes its shrink back
        self._shrunk: dict[int, tuple] = {}
        self.apply_settings(settings)

    def install(self, model: Model, adamw_v) -> None:
        """Learn the wide slots of `model`'s weights; the AdaGrad sums are the tail of
        AdamW's `v` (`adamw_v`), which AdamW skips. The second looks waiting are kept: they
        hold features and labels, not weights."""
        s = self.settings
        self.learner = (WideAdaGrad.for_model(model, adamw_v, lr=s.wide_lr, l2=s.wide_l2,
                                              pair_lr=s.wide_pair_lr,
                                              pair_first=s.wide_pair_first,
                                              rule_blocks_pair_only=s.wide_pair_owns_rule_blocks)
                        if "wide.w" in model.params else None)
        self.dirty = False
        self._shrunk = {}  # other weights now: a pending alarm's shrink is not taken back

    def apply_settings(self, s: TrainConfig) -> None:
        self.settings = s
        if self.learner is not None:
            self.learner.lr, self.learner.l2 = s.wide_lr, s.wide_l2
            self.learner.pair_lr, self.learner.pair_first = s.wide_pair_lr, s.wide_pair_first
            self.learner.rule_blocks_pair_only = s.wide_pair_owns_rule_blocks
        # the second look learns beside a transformer logit of 0; with `wide_residual` the
        # logit of its first look would be another transformer's: no second look then
        self.second_look.delay = 0 if s.wide_residual else s.wide_second_look

    def relabel(self, fp: str, label: float, corrected: bool) -> None:
        """A newer signal for the call `fp` (a correction, `corrected`, or a later decision
        of the gate): its waiting look takes `label`."""
        self.second_look.note(fp, label, corrected)

    def learn(self, sources: dict, z_deep: np.ndarray, fresh: list[dict],
              draw_replay: DrawReplay) -> None:
        """The wide path learns from every fresh signal (not held back for the promotion
        gate), in order, at once: AdaGrad with the serving transformer's logit `z_deep` as
        the fixed rest of the gate's (engine/wide.py), or with 0 there when `wide_residual`
        is off (it then learns on its own, and only the transformer's step sees the other
        part). After each, `train.wide_replay` examples from the replay reservoir,
        interleaved: a second look at what came before (off by default: it learns faster
        before a policy change and adapts slower after one; docs/learning.md, "The wide
        path replays"). Cheap (a few hundred buckets per signal), so nothing is skipped,
        not even when the transformer falls behind.

        Each learned signal also gets a second look `train.wide_second_look` signals
        later, under the newest label of its call (a correction's), at weight 1: by then
        the gate's mistakes are mostly corrected (docs/learning.md, "A second look"); one
        whose label is still the gate's "allow" against a pair term saying "block" by more
        than `train.wide_doubt_logits` steps at `train.wide_doubt_weight`
        (docs/learning.md, "Doubting an uncorrected allow").
        Until then, an "allow" that the pair term contradicts by more than
        `train.wide_pair_hold` steps the linear weights only (`WideAdaGrad.learn`;
        docs/learning.md, "The pair term holds")."""
        if self.learner is None:
            return
        s = self.settings
        # the pair term learns a contradicting "allow" at the second look, if there is one
        hold = s.wide_pair_hold if self.second_look.delay > 0 else 0.0
        learn = [i for i, ex in enumerate(fresh) if not ex.get("held")]
        replay, r_src = draw_replay(len(learn) * s.wide_replay)
        per = len(replay) / max(1, len(learn))
        for n, i in enumerate(learn):
            ex = fresh[i]
            row = wide_row(sources, i)  # learned now, and kept for its second look
            ordinary = ex["feedback"] not in CORRECTIONS
            self.learner.learn(row[0], row[1], float(z_deep[i]) if s.wide_residual else 0.0,
                               ex["label"], ex["weight"] * self.early_block(ex["seq"], ex["label"],
                                                                            ordinary),
                               row[2], pair_hold=hold, novel_at=row[3])
            for j in range(round(n * per), round((n + 1) * per)):  # interleaved, in turn
                r_idx, r_val, r_pair, r_novel = wide_row(r_src, j)
                self.learner.learn(r_idx, r_val, 0.0, replay[j]["label"], replay[j]["weight"],
                                   r_pair, novel_at=r_novel)
            self._learn_looks(self.second_look.push(ex["seq"], ex["fp"], ex["label"], row,
                                                    not ordinary), ex["seq"])
        self.dirty = True

    def _learn_looks(self, due: list[DueLook], seq: int) -> None:
        """Learn the second looks `due` when signal `seq` arrived, each under the newest
        label of its call; one whose label is still the gate's own is doubted
        (`train.wide_doubt_weight`, `_logits`) where the pair term says otherwise."""
        s = self.settings
        doubt = (s.wide_doubt_weight, s.wide_doubt_logits)
        for (idx, val, pair, novel_at), label, corrected in due:
            self.learner.learn(idx, val, 0.0, label, self.early_block(seq, label, True), pair,
                               doubt=NO_DOUBT if corrected else doubt, novel_at=novel_at)

    def block_weight(self, ex: dict) -> float:
        """What a "block" label of signal `ex` weighs in this path's first look, whatever
        its label now: its calibration pair carries it (`PlattCalibrator.update`), and a
        correction that relabels the pair to "block" keeps the weight of the signal."""
        return self.early_block(ex["seq"], 0.0, ex["feedback"] not in CORRECTIONS)

    def early_block(self, seq: int, label: float, ordinary: bool) -> float:
        """The weight factor of an example learned when signal `seq` arrived
        (`early_block_weight` with this path's settings; 1 without a wide path)."""
        if self.learner is None:
            return 1.0
        s = self.settings
        return early_block_weight(seq, label, ordinary, s.wide_early_block_weight,
                                  s.wide_early_block_signals)

    def on_drift(self, began_seq: int, seen_seq: int) -> bool:
        """A policy change began at `began_seq` (the alarm came at signal `seen_seq`): the
        looks waiting from before it carry the old policy's labels (dropped), the ones
        from it on are the new policy's first evidence and are taken at once
        (with `train.drift_look_now`), AdaGrad's shrunken steps are relaxed
        (`train.drift_wide_relax`, the pair term's by `train.drift_wide_pair_relax`) so
        the path moves as fast as at the start, the linear weights shrink by
        `train.drift_wide_shrink` until the alarm's verdict (`on_drift_verdict`), a
        bag's members all learn the next `train.drift_wide_bag_all` examples, and for the
        next `train.drift_wide_contra_examples` a label that contradicts the path relaxes
        its buckets' sums (`train.drift_wide_contra_relax`). True if the linear weights
        were shrunk."""
        s = self.settings
        undo = adapt_to_drift(self.second_look, self.learner, began_seq, s.drift_wide_relax,
                              s.drift_wide_pair_relax, s.drift_wide_bag_all,
                              s.drift_wide_shrink, (s.drift_wide_contra_relax,
                                                    s.drift_wide_contra_examples,
                                                    s.drift_wide_contra_margin,
                                                    s.drift_wide_contra_decay,
                                                    s.drift_wide_contra_decay_votes))
        if self.learner is not None and s.drift_look_now:
            due = self.second_look.take_from(began_seq, seen_seq)
            evidence = [(idx, val, label, novel_at)
                        for (idx, val, _pair, novel_at), label, _ in due]
            with self.learner.alarm_evidence(evidence):  # they may start before the change
                self._learn_looks(due, seen_seq)
            self.dirty = True
        if undo is None:
            return False
        self._shrunk[began_seq] = undo
        self.dirty = True
        return True

    def drift_note(self, shrunk: bool) -> str:
        """What `on_drift` did beyond the relax, for the trainer's drift log ("" if
        nothing): the shrink (`shrunk`: it acted) and the contradiction window (open: the
        learner says so, whatever decided it), and the looks taken at once (`drift_look_now`)."""
        s, note = self.settings, ""
        if shrunk:
            note += f", the wide path's linear weights x{s.drift_wide_shrink:g} (kept if confirmed)"
        if self.learner is not None and self.learner.contra_left > 0:
            decay = ""
            if s.drift_wide_contra_decay != 1.0:
                decay = ("; the weights it pushes against that nothing in the window "
                         f"supported x{s.drift_wide_contra_decay:g}")
                if s.drift_wide_contra_decay_votes > 1:
                    decay += (f" once {s.drift_wide_contra_decay_votes} labels have gone "
                              "against them")
                    if s.drift_look_now:
                        decay += ", each of the alarm's looks counting as all"
            note += (f", and for the next {s.drift_wide_contra_examples} examples the wide "
                     "path's features of a call it gets wrong by more than "
                     f"{s.drift_wide_contra_margin:g} logits step as if new (sums "
                     f"x{s.drift_wide_contra_relax:g}{decay})")
        if self.learner is not None and s.drift_look_now:
            note += ", the second looks waiting since the change's start taken now"
        return note

    def on_drift_verdict(self, began_seq: int, confirmed: bool) -> None:
        """The alarm's verdict: a withdrawn alarm (the gate's own mistakes, corrected
        since) takes the shrink back and keeps what was learned meanwhile; a confirmed one
        keeps it. After a restart in between there is nothing to take back (the weights
        before are not part of a checkpoint) and a withdrawn alarm's shrink stays."""
        undo = self._shrunk.pop(began_seq, None)
        if adapt_to_drift_verdict(self.learner, undo, confirmed):
            self.dirty = True


def early_block_weight(seq: int, label: float, ordinary: bool, weight: float,
                       signals: int) -> float:
    """How much more a "block" label weighs in the wide path's step while the state is
    young: `weight` at the first signal, fading linearly to 1 after signal `signals`
    (1-based sequence numbers of the signal log), and always 1 for an "allow" label or an
    example that is not `ordinary` (a correction or override has its own weight). The
    first looks and the second looks of ordinary signals are ordinary.

    Why (docs/learning.md, "Blocks weigh more at first"): block is the minority, and each
    of the dozen block categories has been shown only a handful of times in the first
    thousand signals; against the hundreds of allowed calls whose words and shapes an
    unseen block shares, those few examples lost (block recall on unseen values 0.69-0.84
    at the first checkpoints). A class weight for good lowered accuracy on unseen
    allowed calls ("Why blocks are not weighted up"); one that fades out (2 over 2,000
    signals, the default) lifted block recall on unseen values in the daemon from 170 to
    178 of 184 checkpoints over eight seeds, mostly at the first, for 4 of unseen values
    (allowed ones at the first checkpoint) and 2 of the lead over the anchor (ties)
    (docs/learning.md, "Eight seeds with blocks weighing more at first"). The calibration
    weighs its pairs the same way (`PlattCalibrator.update`). bench/bench_wide_features.py's
    replay calls this too."""
    if label >= 0.5 or not ordinary or seq > signals or weight == 1.0:
        return 1.0
    return 1.0 + (weight - 1.0) * (1.0 - max(0, seq - 1) / signals)


def adapt_to_drift(second_look: SecondLook, learner: WideAdaGrad | WideBag | None,
                   began_seq: int, relax: float, pair_relax: float | None,
                   bag_all: int, shrink: float = 1.0,
                   contra: tuple[float, int, float, float, int] = (1.0, 0, 0.0, 1.0, 1)
                   ) -> tuple | None:
    """What a drift alarm does to the wide path (`WidePath.on_drift`), in one place so that
    bench/bench_wide_features.py's replay responds to its alarms as the daemon does: the
    waiting second looks from before `began_seq` are dropped, AdaGrad's sums relaxed
    (`WideAdaGrad.relax`), the linear weights multiplied by `shrink`
    (`WideAdaGrad.shrink`), a bag's members all learn the next `bag_all` examples, and
    the next examples whose labels contradict the path relax their buckets' sums and decay
    their unsupported weights (`contra` = (factor, examples, margin, decay, votes):
    `WideAdaGrad.relax_contradicted`; factor and decay 1, or 0 examples: off). Returns
    what `adapt_to_drift_verdict` needs to take the shrink back
    (None: nothing shrunk).

    Why the shrink acts at the alarm and not at its verdict ~50 signals later: the
    new policy's first ~100 signals are where the old policy's confident weights cost
    (measured at the verdict it gained 1 error in the 250 after the change over six
    seeds, at the alarm 19 over eight: docs/learning.md "Shrinking the wide path at a
    drift alarm")."""
    second_look.forget_before(began_seq)
    if learner is None:
        return None
    learner.relax(relax, pair_relax)
    learner.learn_all_for(bag_all)
    if (contra[0] != 1.0 or contra[3] != 1.0) and contra[1] > 0:
        learner.relax_contradicted(*contra)
    return (shrink, learner.shrink(shrink)) if shrink != 1.0 else None


def adapt_to_drift_verdict(learner: WideAdaGrad | WideBag | None, undo: tuple | None,
                           confirmed: bool) -> bool:
    """A drift alarm's verdict for the wide path: withdrawn, the shrink `undo` (what
    `adapt_to_drift` returned) is taken back (`WideAdaGrad.unshrink`: what was learned
    since stays), so is what the contradiction window took -- the weights its decay took,
    the sums it relaxed (`WideAdaGrad.restore_window`) -- and what contradicts the path
    relaxes and decays nothing more, nor does a bag's every member learn every example
    (the labels were the gate's own mistakes: the alarm's adaptation ends). True if the
    weights or their sums changed."""
    if learner is None or confirmed:
        return False
    restored = learner.restore_window()
    learner.relax_contradicted(1.0, 0, 0.0)
    learner.learn_all_for(0)
    if undo is None:
        return restored
    factor, before = undo
    learner.unshrink(before, factor)
    return True


def wide_row(sources: dict, i: int) -> tuple:
    """(idx, val, pair features or None, where the domain key sits or -1) of row `i` of a
    `source_batch`: what `WideAdaGrad.learn` reads of one signal, trimmed of padding
    (value 0, which the learner drops anyway) into copies, so a row kept for a second look
    does not keep its whole batch alive; the domain key's place (`NOVEL_AT`, its
    first-seen mark after it) counted in the trimmed row."""
    idx, val = sources["wide_idx"][i], sources["wide_val"][i]
    pair = tuple(sources[k][i] for k in PAIR_KEYS) if PAIR_KEYS[0] in sources else None
    keep = val != 0
    novel_at = int(sources[NOVEL_AT][i]) if NOVEL_AT in sources else -1
    if novel_at >= 0:
        novel_at = int(keep[:novel_at].sum())
    if pair is not None:
        c_idx, c_val, h_idx, h_val, h_grp = pair
        c_keep, h_keep = c_val != 0, h_val != 0
        pair = (c_idx[c_keep], c_val[c_keep], h_idx[h_keep], h_val[h_keep], h_grp[h_keep])
    return idx[keep], val[keep], pair, novel_at
