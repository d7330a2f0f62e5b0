"""Publication, rollback and checkpoint: how the trainer's weights reach serving and disk.

A swap publishes the training weights (to the serving snapshot, and to LMDB as the next
version) every `swap_every_steps` steps or `swap_every_seconds`, when the promotion gate
(promotion.py) agrees; the weights published last and their optimiser state are kept in
host memory (`_GoodState`), and a non-finite step or weights, a GPU error (gpu.py) or
`promotion_max_refusals` refusals in a row roll training back to them. A checkpoint saves
what the trainer resumes from (resume.py), then applies retention to the signal log.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from dataclasses import dataclass

import numpy as np

log = logging.getLogger("gated.trainer")

#: Published versions kept in LMDB (what `gated rollback --to` can go back to).
KEEP_VERSIONS = 10


@dataclass
class _GoodState:
    """The last published weights and their optimiser state, in HOST memory: a rollback
    copies them back, and a GPU that no longer answers cannot take them with it."""

    flat: np.ndarray
    m: np.ndarray
    v: np.ndarray
    t: int


class Publication:
    """Mixin of `Trainer`: swap, rollback, checkpoint. Uses the trainer's model, AdamW,
    serving snapshot, store, status, settings, events, clock, promotion gate, wide path,
    window, monitor, retention, `_deep_version`, `_in_step`, `_judging` and `_turn`; the
    state below is set in `Trainer.__init__` (and `_steps_since_swap` counted by its
    step)."""

    _good: _GoodState  # what a rollback restores
    _last_swap_time: float  # by `clock`: the last publication, or a refused judgement
    #: by `clock`: a publication due before the cadence's (`publish_soon`, a drift alarm's
    #: `due_now`); inf: none. Reset by `_swapped_at`.
    _due_early: float
    _steps_since_swap: int
    _refusals: int  # promotion refusals in a row
    _last_ckpt_step: int

    def _host_copy(self, a) -> np.ndarray:
        """A host array with the values of `a` that does not alias it."""
        host = self.model.ops.to_numpy(a)
        return np.array(host, copy=True) if isinstance(a, np.ndarray) else host

    def _capture(self, flat: np.ndarray | None = None) -> _GoodState:
        """The current weights and optimiser state, copied to host memory (`flat`: a host
        copy of the weights already made)."""
        return _GoodState(self._host_copy(self.model.flat) if flat is None else flat,
                          self._host_copy(self.opt.m), self._host_copy(self.opt.v), self.opt.t)

    def _rollback(self, why: str) -> None:
        g, xp = self._good, self.model.ops.xp
        self.model.flat[...] = xp.asarray(g.flat)
        self.opt.m[...] = xp.asarray(g.m)
        self.opt.v[...] = xp.asarray(g.v)
        self.opt.t = g.t
        self._deep_version += 1
        self.wide_path.dirty = False  # the wide path is back at its published weights too
        self._count_rollback(why)

    def _count_rollback(self, why: str) -> None:
        self.status.rollbacks += 1
        log.warning("training step rolled back (%s): weights and optimiser state restored to "
                    "published version %d; nothing non-finite was published", why,
                    self.status.version)
        self.events.on_rollback(why)

    @property
    def next_swap_at(self) -> float:
        """When (by `clock`) the swap cadence next allows a publication."""
        return min(self._last_swap_time + self.settings.swap_every_seconds, self._due_early)

    def _swapped_at(self, t: float) -> None:
        """A publication (or a judgement that refused one) at `t`: the cadence counts from
        there, and an earlier due time asked for before it is spent."""
        self._last_swap_time = t
        self._due_early = math.inf

    def due_now(self) -> None:
        """The next chance publishes (the promotion gate still judges): a drift alarm's
        shrunk wide path."""
        self._due_early = -math.inf

    def publish_soon(self) -> None:
        """A fresh call labelled block that serving leaned allow on (p_allow >= 0.5) while
        unsure (below the allow band: it answered `ask`), or that a person corrected to
        block whatever serving answered: the wide path has learned it by now, and the next
        publication is due `swap_soon_seconds` after the last one, not
        `swap_every_seconds` (0: off). The promotion gate still judges. Not in the
        state's warm-up (`Monitor.warm`: the first `allow_band_after` signals scored):
        there one block swings the young wide path, its bias most, and published at once
        it answered the next 30 allowed calls `block` (seed 16's first signals); the
        ordinary cadence publishes it with the ~20 allowed calls learned meanwhile.

        Why: a new block category or history rule that the wide path learned at once
        reached serving only at the next 1-second swap, ~20 signals of realistic traffic
        later (bench/bench_learning.py seed 18: the secret-then-POST rule learned from
        signals 516-518 missed the checkpoint at ~521). Why not after every block serving
        leaned allow on: once the state has learned, nearly all of those are the noisy
        gate's wrong blocks of calls serving is sure to allow (30-50 in every 1,000
        signals, p_allow >= 0.9 for 9 in 10 of them, where the real misses of the first
        1,000 had p_allow < 0.9 for 19 of 24), a publication writes the whole weights to
        LMDB (~40-90 ms for flint on a 2-core CPU) and the daemon's serving process reads
        them back, and publishing after each raised the versions from ~45 to 54-74 in
        every 1,000 signals for nothing (docs/learning.md, "Publishing an unsure miss
        soon").

        A second such call before that publication changes nothing. (Before 2026-12-03
        each call moved the cadence's origin `swap_every_seconds - swap_soon_seconds`
        earlier, so a second one within `swap_soon_seconds` of the last publication made
        it due at once, against this docstring.)"""
        s = self.settings
        if s.swap_soon_seconds > 0:
            self._due_early = min(self._due_early,
                                  self._last_swap_time + s.swap_soon_seconds)

    def publish_if_due(self) -> bool:
        """Idle (nothing fresh to take): publish what the wide path learned, if a swap is
        due and the promotion gate agrees."""
        return self._maybe_swap(force=False)

    def publish_now(self) -> bool:
        """Publish the training weights now, changed or not (a fresh start or --reinit:
        the stored published version must be what this trainer scores with). Not judged
        by the promotion gate: they are what serves already."""
        self.wide_path.dirty = True
        return self._maybe_swap(force=True, judge=False)

    def _promoted(self, wide_only: bool = False) -> bool:
        """The promotion gate's verdict on the training weights (promotion.py), or with
        `wide_only` on the serving transformer with the training wide path
        (`_publish_wide_progress`); a refusal is logged and counted, and after
        `promotion_max_refusals` in a row training restarts from the serving weights."""
        if wide_only:
            d = self.promotion.judge_wide(self.model, self.serving)
        else:
            self._judging = True  # its forward takes turns (`Trainer._judgement_turn`)
            try:
                d = self.promotion.judge(self.model, self._deep_version, self.serving)
            finally:
                self._judging = False
        self.events.on_promotion(d.as_dict())
        if d.published:
            self._refusals = 0
            return True
        self._refusals += 1
        log.warning("promotion gate: candidate NOT published (%s); serving keeps version %d "
                    "(refusal %d in a row)", d.reason, self.status.version, self._refusals)
        self._swapped_at(self.clock())  # judge again after the next interval
        if (self._refusals >= self.settings.promotion_max_refusals and not self._in_step
                and not self._judging):
            # (in the middle of a step the rollback waits for the step's own swap)
            self._refusals = 0
            self._rollback(f"promotion gate refused {self.settings.promotion_max_refusals} "
                           "candidates in a row")
        return False

    def _maybe_swap(self, force: bool, judge: bool = True) -> bool:
        if self._steps_since_swap == 0 and not self.wide_path.dirty:
            return False
        s = self.settings
        due = self._steps_since_swap >= s.swap_every_steps or self.clock() >= self.next_swap_at
        if not (due or force):
            return False
        if not self.model.ops.all_finite(self.model.flat):
            if not (self._in_step or self._judging):  # else after them: the step checks
                self._rollback("non-finite weights at swap")
            return False
        if self._judging:  # a turn inside a judgement: its candidate waits for the verdict
            return self._publish_wide_progress()
        if judge and not (force or self.promotion.due(self._deep_version, self.serving)):
            # judging the new transformer would take more than its share of the trainer's
            # time: publish what the wide path learned meanwhile, beside the serving one
            return self._publish_wide_progress()
        if judge and not self._promoted():
            return False
        if not self.model.ops.all_finite(self.model.flat):  # the judgement's turns learned
            if not self._in_step:
                self._rollback("non-finite weights at swap")
            return False
        host = self._host_copy(self.model.flat)
        self._publish(self.model.flat, host, self.status.step, judged=judge)
        self._good = self._capture(flat=host)
        if self.model.ewc.lam > 0:
            self.model.ewc.consolidate(self.model.flat)
        self._steps_since_swap = 0
        return True

    def _judgement_turn(self) -> None:
        """Between two chunks of a judgement's forward (promotion.py `between`): what a
        step's turn does (`_turn`: take the signals that arrived, publish), where only the
        wide path's progress beside the serving transformer may publish (`_maybe_swap`)
        -- the candidate under judgement is not published before its verdict. Off where
        a step takes no turns (`train.wide_turns` off, or a GPU)."""
        if self.settings.wide_turns and self.model.ops.xp is np:
            counted = self._turn_seconds
            self._turn()
            # a step's turn that judges counts this time as its own (`_step` reports the
            # step's time without its turns): not twice
            self._turn_seconds = counted

    def _publish(self, flat, host: np.ndarray, step: int, judged: bool,
                 deep: int | None = None) -> None:
        """The next version: `flat` to the serving snapshot, its host copy `host` (with the
        calibration that goes with it) to LMDB; the wide path's progress is published.
        `deep`: the serving transformer's token when `flat` carries that transformer (the
        wide path's progress); else the transformer is new and draws one
        (`Snapshot.deep`: random, so no rollback or --reinit can repeat one)."""
        version = self.status.version + 1
        if deep is None:
            deep = secrets.randbits(62)
        self.serving.swap(flat, version, step, deep=deep)
        cal = self.serving.calibration
        self.store.publish(version, host, step=step, keep=KEEP_VERSIONS,
                           extra={"calibration": cal.as_list(), "deep": deep})
        self.status.version = version
        self.status.swaps += 1
        if judged:
            self.promotion.published(version)
        self.wide_path.dirty = False
        self._swapped_at(self.clock())
        self.events.on_swap(version)

    def _publish_wide_progress(self) -> bool:
        """Publish the serving transformer with the training wide path, when the swap
        cadence is due, the wide path learned something since the last publication and
        the promotion gate passes that candidate (`PromotionGate.judge_wide`: sparse
        dots). The transformer's steps stay unpublished (`_steps_since_swap` is kept, no
        EWC consolidation) until a full judgement is due; what a rollback restores becomes
        the published weights with the optimiser state they had (the transformer's from
        the last full publication, the wide path's AdaGrad sums of now).

        Why: on a 2-core CPU flint's full judgement (a forward of the whole held-back
        slice after each transformer step) is rationed to JUDGE_TIME_SHARE of the trainer's
        time, and nothing was published while it waited: serving answered with weights
        270-340 signals old, and a person's correction reached predictions only then
        (docs/learning.md, "The wide path's progress between judgements")."""
        wide = slice(self.model.deep_size, None)  # the wide path's slots come last
        if (self.model.deep_size == self.model.num_params or not self.wide_path.dirty
                or self.clock() < self.next_swap_at or not self.promotion.due_wide(self.serving)):
            return False
        if not self._promoted(wide_only=True):
            return False
        to_np = self.model.ops.to_numpy
        flat = self._host_copy(self.serving.current.model.flat)  # what was judged: serving's
        flat[wide] = to_np(self.model.flat[wide])  # ... with the training wide path
        self._publish(flat, flat, self.serving.current.step, judged=True,
                      deep=self.serving.current.deep)
        good = self._good  # its state: the last publication's (owned by `_good`) ...
        good.v[wide] = to_np(self.opt.v[wide])  # ... with the wide path's AdaGrad sums now
        self._good = _GoodState(flat, good.m, good.v, good.t)
        return True

    def checkpoint(self) -> None:
        to_np = self.model.ops.to_numpy
        ewc = self.model.ewc.state()
        self.store.save_checkpoint(
            flat=to_np(self.model.flat), m=to_np(self.opt.m), v=to_np(self.opt.v),
            step=self.status.step, last_trained_seq=self.status.last_trained_seq,
            layout=self.model.layout, config_fingerprint=self.model.cfg.fingerprint(),
            ewc={k: to_np(a) for k, a in ewc.items()},
            extra={"opt_t": self.opt.t, "version": self.status.version,
                   "window": self.window.dump(), "monitor": self.monitor.state()})
        self._last_ckpt_step = self.status.step
        self.status.last_checkpoint = time.time()
        self.events.on_checkpoint(self.status.last_checkpoint)
        self._prune()

    def _prune(self) -> None:
        """Retention: drop trained signals past the age/count limits (never untrained)."""
        r = self.retention
        if r is None or not (r.max_age_s or r.max_count):
            return
        pruned = self.store.prune(max_age_s=r.max_age_s or None, max_count=r.max_count or None,
                                  upto_seq=self.status.last_trained_seq)
        if pruned:
            log.info("retention pruned %d trained signals", pruned)

    def _final_checkpoint(self) -> None:
        try:
            self._maybe_swap(force=True)
            self.checkpoint()
            log.info("trainer stopped at step %d, version %d, last trained seq %d (checkpointed)",
                     self.status.step, self.status.version, self.status.last_trained_seq)
        except Exception:
            log.exception("final checkpoint failed; the previous checkpoint is kept and the "
                          "signals after it will be re-trained on restart")
