"""The promotion gate: no candidate is published that is worse than what serves.

A share of the fresh signals (`promotion_holdout_share`, chosen by their (context,
history) fingerprint, so a call is always in or always out) is HELD BACK: scored for
progressive validation like every signal, but never trained on (not by the wide path,
not by the transformer, not replayed). The newest `promotion_holdout_size` of them, with
their labels -- relabelled when a person's correction for the same call arrives (the
correction itself is trained on) -- are the slice a candidate must not do worse on.

Before each publication the candidate (the training weights) and the serving snapshot
are scored on that slice; the candidate is refused only if its alignment (sign of the
logit vs the label) is below the serving one's by more than `promotion_margin` AND the
difference is significant (paired: of the signals the two disagree on, the candidate
loses more than it wins by over two standard errors, McNemar).
Scoring cost is bounded: logits are cached per held-back example -- the serving
snapshot's per version (a published candidate's logits become the new serving version's:
the same weights, so publishing costs no second forward), the candidate's transformer
logits per optimiser step (its wide logit is a sparse dot, recomputed each time) -- so a
judgement runs a forward only for what changed: the examples new to the slice (a few per
second), or the whole slice after a transformer step. A judgement with a forward of more
than `CHEAP_ROWS` rows may take at most `JUDGE_TIME_SHARE` of the trainer's time: after
one that took J seconds the next waits J / JUDGE_TIME_SHARE. On a 2-core CPU flint's
200-signal slice is seconds of forward passes, and judging at every 1-second swap starved
training (measured: the queue grew from ~7,700 signals on); but the wide path's progress
between two transformer steps is judged by sparse dots and is not held back by that
wait (it was: with the whole slice re-scored whenever a held-back signal joined it,
publications came every ~370 signals; measured, docs/learning.md).
While a new transformer waits for its rationed judgement, the wide path's progress
beside the SERVING transformer is judged and published (`judge_wide`; publication.py
`_publish_wide_progress`): its logits on the slice are the serving ones with the wide
part replaced, sparse dots again. Without it nothing was published meanwhile: from the
moment the slice was full flint on a 2-core CPU served weights 270-340 signals old.
With fewer than `promotion_min_holdout` held-back examples the gate lets everything
through (there is nothing to judge on yet). After a detected drift the slice is dropped:
it holds the old policy's labels.

Warm-up (`promotion_holdout_after`): the first signals of a state (seq up to it) and
the first signals after a detected drift are never held back. Those are the signals a
model learns most from -- the first examples of each rare block category, the first of
a new policy -- and while the slice is smaller than `promotion_min_holdout` the gate
judges nothing, so holding them back cost learning and bought no judgement (measured:
docs/learning.md, "The promotion gate's warm-up"). A call learned during the warm-up
and seen again after it may be held back then: its later copies judge a candidate that
has learned it, at 98% distinct contexts a handful of examples of the slice.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...engine import source_batch
from ...engine.infer import InferencePlan
from ...engine.model import length_chunks
from ...engine.wide import without_wide
from ...signals import CORRECTIONS

JUDGE_TIME_SHARE = 0.1  # the most of the trainer's time judging may take
CHEAP_ROWS = 16  # a judgement with a forward of at most this many rows is not rationed
TURN_ROWS = 16  # a judgement's forward turns (`PromotionGate.between`) after this many rows


@dataclass
class PromotionDecision:
    """The last decision, for `gated status` and the log."""

    published: bool
    candidate: float  # alignment on the held-back slice
    serving: float
    examples: int
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"published": self.published, "candidate": self.candidate,
                "serving": self.serving, "examples": self.examples, "reason": self.reason}


class PromotionGate:
    """Held-back slice + the comparison. `share` 0 or `size` 0 turns the gate off."""

    def __init__(self, share: float, size: int, margin: float, min_examples: int,
                 warmup: int = 0) -> None:
        self.share, self.margin, self.min_examples = share, margin, min_examples
        self.warmup = warmup
        #: signals up to this seq are never held back (the warm-up, see the module doc)
        self.hold_after_seq = warmup
        self.ring: deque[dict] = deque(maxlen=max(1, size))
        self.size = size
        self.last: PromotionDecision | None = None
        #: logits per held-back example (by seq): the serving snapshot's, of `version`,
        #: and the candidate transformer's, at optimiser step `step`
        self._z_serving: tuple[int, dict[int, float]] = (-1, {})
        self._z_deep: tuple[int, dict[int, float]] = (-1, {})
        self._gen = 0  # bumped whenever the slice changes
        self._sources: tuple[int, dict, np.ndarray, list[int]] | None = None
        self._candidate: dict[int, float] | None = None  # z of the last judged, by seq
        self.judge_seconds = 0.0  # what the last judgement cost
        self._judged_at = float("-inf")
        self.clock: Callable[[], float] = time.monotonic  # the trainer's (see there)
        #: called between two chunks of TURN_ROWS rows of a judgement's forward (the
        #: trainer takes the signals that arrived and publishes the wide path's progress:
        #: `Trainer._judgement_turn`); None: the forward runs in one go
        self.between: Callable[[], None] | None = None
        self._turning = False  # inside `between` (a judgement there does not turn again)
        self._turn_seconds = 0.0  # spent in `between` during the current judgement
        self._forgets = 0  # slices dropped by drift alarms (`forget`)

    @property
    def enabled(self) -> bool:
        return self.share > 0 and self.size > 0

    def holds(self, example: dict) -> bool:
        """Is this fresh example held back? Corrections never are (a person's label is
        always trained on), nor signals of the warm-up; the rest by fingerprint, stably."""
        if (not self.enabled or example.get("feedback") in CORRECTIONS
                or example["seq"] <= self.hold_after_seq):
            return False
        bucket = int.from_bytes(example["fp"][:4], "little") % 10_000
        return bucket < self.share * 10_000

    def add(self, examples: list[dict]) -> None:
        if examples:
            self.ring.extend(examples)
            self._gen += 1

    def relabel(self, fp: bytes, label: float) -> None:
        """A correction for a held-back call: the slice judges by the corrected label."""
        changed = False
        for ex in self.ring:
            if ex["fp"] == fp and ex["label"] != label:
                ex["label"] = label
                changed = True
        if changed:
            self._gen += 1
            self._sources = None  # its labels changed: no judgement uses the old ones

    def forget(self, seen_seq: int) -> None:
        """A drift detected at signal `seen_seq`: the slice's labels are the old policy's;
        the next `warmup` signals are all learned (the new policy's first)."""
        self.ring.clear()
        self.hold_after_seq = max(self.hold_after_seq, seen_seq + self.warmup)
        self._gen += 1
        self._forgets += 1
        self._sources = None

    def due(self, step: int | None = None, serving: Any = None) -> bool:
        """May a candidate (transformer at optimiser step `step`) be judged now? Always
        while the slice is too small to judge on, or when the judgement needs a forward of
        at most CHEAP_ROWS rows; else within JUDGE_TIME_SHARE of the trainer's time."""
        if not self.enabled or len(self.ring) < self.min_examples:
            return True
        if step is not None and serving is not None:
            seqs = [ex["seq"] for ex in self.ring]
            if self._missing(seqs, step, serving.current.version) <= CHEAP_ROWS:
                return True
        return self.clock() - self._judged_at >= self.judge_seconds / JUDGE_TIME_SHARE

    def _missing(self, seqs: list[int], step: int, version: int) -> int:
        """Rows a judgement would have to run forward now."""
        deep = self._z_deep[1] if self._z_deep[0] == step else {}
        serve = self._z_serving[1] if self._z_serving[0] == version else {}
        return sum(q not in deep for q in seqs) + sum(q not in serve for q in seqs)

    def published(self, version: int) -> None:
        """The last judged candidate now serves as `version`: its logits on the slice are
        the serving ones (same weights), so the next judgement needs no serving forward."""
        # (by seq: valid for those examples whatever the slice has gained since)
        if self._candidate is not None:
            self._z_serving = (version, dict(self._candidate))

    def judge(self, model: Any, step: int, serving: Any) -> PromotionDecision:
        """Compare the training model (at optimiser step `step`) with the serving snapshot
        on the slice; record and return the decision."""
        n = len(self.ring)
        if not self.enabled or n < self.min_examples:
            warm = (f"; nothing is held back up to signal {self.hold_after_seq} (the "
                    "warm-up: promotion_holdout_after)" if self.hold_after_seq > 0 else "")
            self.last = PromotionDecision(True, float("nan"), float("nan"), n,
                                          f"fewer than {self.min_examples} held-back "
                                          f"examples: not judged{warm}")
            return self.last
        t0, forgets = self.clock(), self._forgets
        self._turn_seconds = 0.0
        sources, labels, seqs = self._slice(model.cfg)
        rows = self._missing(seqs, step, serving.current.version)
        z_deep = self._deep_logits(model, step, sources, seqs)
        if self._forgets != forgets:  # a drift alarm in a turn dropped the slice
            self.last = PromotionDecision(True, float("nan"), float("nan"), 0,
                                          "the held-back slice was dropped by a drift alarm "
                                          "during the judgement (its labels were the old "
                                          "policy's): not judged")
            return self.last
        # the serving logits last: turns may have published the wide path's progress
        z_serve = self._serving_logits(serving, sources, seqs)
        z_cand = z_deep + model.wide_logit(sources)
        self._candidate = dict(zip(seqs, z_cand.tolist(), strict=True))
        if rows > CHEAP_ROWS:  # only a judgement with a real forward is rationed
            self._judged_at = self.clock()
            self.judge_seconds = self._judged_at - t0 - self._turn_seconds
        return self._decide(z_cand, z_serve, labels)

    def due_wide(self, serving: Any) -> bool:
        """May the wide path's progress alone be judged now (`judge_wide`)? When the
        serving snapshot's logits lack at most CHEAP_ROWS of the slice: the candidate's
        transformer part is the serving one's, so nothing else needs a forward."""
        if not self.enabled or len(self.ring) < self.min_examples:
            return True
        snap = serving.current
        known = self._z_serving[1] if self._z_serving[0] == snap.version else {}
        return sum(ex["seq"] not in known for ex in self.ring) <= CHEAP_ROWS

    def judge_wide(self, model: Any, serving: Any) -> PromotionDecision:
        """Judge the candidate made of the serving snapshot's transformer and the training
        model's wide path (what `Publication` publishes while a new transformer waits for
        its rationed judgement): its logits are the serving ones with the serving wide
        logit replaced by the training one -- sparse dots, no forward beyond the slice's
        new examples -- so it is never rationed. Why: a transformer step makes the next
        full judgement a forward of the whole slice, and at most JUDGE_TIME_SHARE of the
        trainer's time is spent on those; before this, nothing was published meanwhile,
        and flint on a 2-core CPU served weights 270-340 signals old from the moment the
        slice was full (docs/learning.md, "The wide path's progress between judgements")."""
        n = len(self.ring)
        if not self.enabled or n < self.min_examples:
            return self.judge(model, -1, serving)  # not judged at all (the same message)
        # rebuilt before the serving logits lack more than CHEAP_ROWS of it (`due_wide`)
        sources, labels, seqs = self._slice(model.cfg, stale_ok=CHEAP_ROWS // 2)
        z_serve = self._serving_logits(serving, sources, seqs)
        z_cand = (z_serve - serving.current.model.wide_logit(sources)
                  + model.wide_logit(sources))
        self._candidate = dict(zip(seqs, z_cand.tolist(), strict=True))
        return self._decide(z_cand, z_serve, labels, "the wide path's progress: ")

    def _decide(self, z_cand: np.ndarray, z_serve: np.ndarray, labels: np.ndarray,
                what: str = "") -> PromotionDecision:
        """The verdict on a candidate's logits against the serving ones on the slice (the
        examples judged: a wide judgement's slice may be a few examples older than the
        ring)."""
        n = int(labels.size)
        right_c, right_s = (z_cand >= 0) == labels, (z_serve >= 0) == labels
        cand, serve = float(np.mean(right_c)), float(np.mean(right_s))
        # Paired (McNemar): only the signals the two models disagree on tell them apart.
        # Refuse when the candidate is worse by more than the margin AND by more than two
        # standard errors of that count: on ~150 signals a 1-point margin alone is one or
        # two signals, and noise refused good candidates (measured: 27 refusals in a
        # 12,000-signal learning run).
        lost = int(np.sum(right_s & ~right_c))
        won = int(np.sum(right_c & ~right_s))
        ok = not (serve - cand > self.margin and lost - won > 2.0 * np.sqrt(lost + won))
        why = (f"{what}candidate {cand:.3f} vs serving {serve:.3f} on {n} held-back signals "
               f"(margin {self.margin:g}; the candidate is wrong on {lost} the serving "
               f"model gets right, right on {won} it gets wrong)")
        self.last = PromotionDecision(ok, cand, serve, n, why)
        return self.last

    def _slice(self, cfg: Any, stale_ok: int = 0) -> tuple[dict, np.ndarray, list[int]]:
        """The slice's `source_batch`, labels and seqs, rebuilt only when it changed --
        or, with `stale_ok`, when more than that many of its examples are new since (a
        relabel always rebuilds it). Why: the wide path's progress is judged about every
        second and a held-back example joins about as often; rebuilding the batch of 200
        realistic sources costs ~80 ms, and the slice as it was a few examples ago is as
        good a held-out sample (none of it is ever trained on)."""
        if self._sources is not None and stale_ok and self._sources[0] != self._gen:
            cached = set(self._sources[3])
            if sum(ex["seq"] not in cached for ex in self.ring) <= stale_ok:
                return self._sources[1], self._sources[2], self._sources[3]
        if self._sources is None or self._sources[0] != self._gen:
            items = list(self.ring)
            self._sources = (self._gen,
                             source_batch([(e["context"], e["history"]) for e in items], cfg),
                             np.array([e["label"] >= 0.5 for e in items]),
                             [e["seq"] for e in items])
        return self._sources[1], self._sources[2], self._sources[3]

    def _cached(self, cache: tuple[int, dict[int, float]], key: int, seqs: list[int],
                sources: dict, forward: Any, turns: bool = False
                ) -> tuple[tuple[int, dict[int, float]], np.ndarray]:
        """Logits of the slice (`sources`, its examples' `seqs`) from `cache` (valid for
        `key`), running `forward` on the rows it lacks, TURN_ROWS rows of similar length
        at a time, with `turns` a turn (`between`) between two of them; the new cache
        keeps only the slice's examples. (The serving snapshot's rows take no turns: a
        turn may publish, and their logits are of the snapshot they began with.)

        Why the turns: a whole slice is ~3.6-4 s of flint's forward on one core of this
        project's 2-core VM (200 realistic sources), and the trainer took no signal and
        published nothing meanwhile -- live, 21 gaps of 2.5-5.8 s between publications
        served 13% of a 10-minute stream with older weights, and the one that fell on a
        policy change's first 90 signals lost the change's checkpoint (docs/learning.md,
        "A judgement in turns")."""
        known = cache[1] if cache[0] == key else {}
        todo = [i for i, q in enumerate(seqs) if q not in known]
        fresh: dict[int, float] = {}
        if todo:
            host = {k: np.asarray(v)[todo] for k, v in sources.items()}
            for n, (rows, part) in enumerate(length_chunks(host, TURN_ROWS)):
                if n and turns:
                    self._turn()
                fresh.update(zip((seqs[todo[r]] for r in rows), forward(part).tolist(),
                                 strict=True))
        z = {q: known[q] if q in known else fresh[q] for q in seqs}
        return (key, z), np.array([z[q] for q in seqs], dtype=np.float64)

    def _turn(self) -> None:
        """`between`, timed (a judgement's rationed cost leaves it out), never nested."""
        if self.between is None or self._turning:
            return
        self._turning, t0 = True, self.clock()
        try:
            self.between()
        finally:
            self._turning = False
            self._turn_seconds += self.clock() - t0

    def _serving_logits(self, serving: Any, sources: dict, seqs: list[int]) -> np.ndarray:
        snap = serving.current
        self._z_serving, z = self._cached(self._z_serving, snap.version, seqs, sources,
                                          snap.logits)
        return z

    def _deep_logits(self, model: Any, step: int, sources: dict, seqs: list[int]
                     ) -> np.ndarray:
        plan: list = []  # the candidate's inference plan, built at its first chunk

        def forward(part: dict) -> np.ndarray:
            if not plan:
                on_cpu = getattr(model.ops, "name", "numpy") == "numpy"
                plan.append(InferencePlan(model) if on_cpu else model)
            return plan[0].predict_z(without_wide(part))
        self._z_deep, z = self._cached(self._z_deep, step, seqs, sources, forward, turns=True)
        return z
