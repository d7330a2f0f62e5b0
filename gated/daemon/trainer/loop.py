"""The online trainer's loop: learns from the signal log and publishes snapshots.

Who writes what: the daemon's group-commit thread appends signals; the trainer (in the
trainer process, daemon/trainer_process.py) is the only writer of checkpoints, published
snapshots, the replay reservoir and the metrics history. The
signal log is the trainer's queue: it reads signals after its last trained sequence
number, so a restart re-trains exactly what came after the last checkpoint.

Per step: take fresh signals, score each with the SERVING snapshot before training on it
(progressive validation), mix in replayed examples, forward/backward/clip/AdamW on the
trainer's own copy, roll back on NaN/Inf, swap every N steps or T seconds (publication.py).
A step that raises on the GPU is handled by gpu.py; on the CPU an exception is a bug and
still surfaces (the trainer process exits and its supervisor restarts it).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...config import TrainConfig
from ...engine import EWC, AdamW, Model, build_batch, source_batch, train_step
from ...online import AlignmentWindow
from ...online.monitor import Monitor, MonitorSettings
from ...online.per_tool import tool_of
from ...signals import CORRECTIONS, context_fingerprint, training_example
from ...store import StoreError
from ..serving import Calibration, Serving
from .control import Control
from .cores import ChunkCores
from .drift import DriftResponse
from .gpu import GpuFallback
from .latest import LatestLabels
from .promotion import PromotionGate
from .publication import Publication
from .wide_path import WidePath

__all__ = ["AlignmentWindow", "Trainer", "TrainerEvents"]

log = logging.getLogger("gated.trainer")


def step_chunk_rows(settings: TrainConfig, turns: bool) -> int | None:
    """Rows per chunk of a training step: `step_chunk_rows`, and with turns (on the CPU)
    at most `wide_turn_rows` (the wide path takes the new signals after each chunk); None:
    the batch in one piece. bench/bench_step.py times the step at this size too."""
    rows, turn = settings.step_chunk_rows, settings.wide_turn_rows
    if turns and turn:
        rows = min(rows, turn) if rows else turn
    return rows or None


class TrainerEvents:
    """Hooks the daemon uses to export metrics; the defaults do nothing."""

    def on_step(self, info: dict, seconds: float) -> None: ...
    def on_scored(self, window: AlignmentWindow, converged: bool,
                  stats: dict | None = None, backpropagated: int = 0) -> None: ...
    def on_swap(self, version: int) -> None: ...
    def on_rollback(self, reason: str) -> None: ...
    def on_checkpoint(self, ts: float) -> None: ...
    def on_gpu_fallback(self, reason: str) -> None: ...
    def on_drift(self, began_seq: int) -> None: ...
    def on_drift_verdict(self, began_seq: int, confirmed: bool, dropped: int) -> None: ...
    def on_promotion(self, decision: dict) -> None: ...
    def on_operator_rollback(self, result: dict) -> None: ...


@dataclass
class TrainerStatus:
    step: int = 0
    version: int = 0
    last_trained_seq: int = 0
    last_loss: dict = field(default_factory=dict)
    rollbacks: int = 0
    swaps: int = 0
    last_checkpoint: float = 0.0
    #: fresh signals scored with the transformer logit serving answered them with
    #: (`ServedDeep`), and with the transformer run again
    scored_reused: int = 0
    scored_computed: int = 0


class Trainer(Control, DriftResponse, GpuFallback, Publication, threading.Thread):
    """Owns the training model and optimiser; nothing else touches them."""

    def __init__(self, store, serving: Serving, model: Model, settings: TrainConfig, *,
                 step: int = 0, version: int = 0, last_trained_seq: int = 0,
                 opt_state: dict | None = None, ewc_state: dict | None = None,
                 events: TrainerEvents | None = None, seed: int = 0) -> None:
        super().__init__(name="gated-trainer", daemon=True)
        self.store, self.serving = store, serving
        self.settings = settings
        self.events = events or TrainerEvents()
        self.rng = random.Random(seed ^ step)
        self.wide_path = WidePath(settings)  # the wide path's learner and schedule
        self._install(model, opt_state, ewc_state)
        self.monitor = Monitor(MonitorSettings(
            window=settings.alignment_window, drift_delta=settings.drift_delta,
            drift_threshold=settings.drift_threshold,
            drift_adapt_signals=settings.drift_adapt_signals,
            drift_confirm_signals=settings.drift_confirm_signals,
            drift_withdraw_below=settings.drift_withdraw_below,
            drift_confirm_waits=settings.drift_confirm_waits,
            allow_band_after=settings.allow_band_after,
            allow_band_drift_hold=settings.allow_band_drift_hold,
            allow_band_p=serving.bands.allow,
            transformer_share_prior=0.0 if self.wide_path.learner is not None else 1.0))
        self.window = self.monitor.window
        #: (seq, calibrated p, raw logit, its transformer part, whether the allow band was
        #: open) of each signal scored since the last `train_on` began or `take_scores`
        #: (the one way to read them); the rest of the raw logit is the wide path's
        self._scores: list[tuple[int, float, float, float, bool]] = []
        self.status = TrainerStatus(step=step, version=version, last_trained_seq=last_trained_seq)
        self._wake = threading.Event()
        self._stop_event = threading.Event()
        self._drain_deadline = float("inf")
        self._settings_lock = threading.Lock()
        #: a reload's (train settings, bands.allow), applied at the next step boundary
        self._pending_settings: tuple[TrainConfig, float] | None = None
        self._pending_rollback: tuple[int, bool] | None = None
        self.paused = False  # an operator's rollback --pause, until resume
        self.retention = None  # a config.RetentionConfig; the daemon sets and reloads it
        self.latest = LatestLabels()  # the replay filter
        #: a CPU step's chunks on several cores at once (`use_cores`); None: one at a time
        self.cores: ChunkCores | None = None
        #: replay examples of signals before this seq are set aside: a drift alarm waits
        #: for its verdict (`_on_drift_verdict`)
        self.replay_floor = 0
        self.promotion = PromotionGate(settings.promotion_holdout_share,
                                       settings.promotion_holdout_size,
                                       settings.promotion_margin,
                                       settings.promotion_min_holdout,
                                       settings.promotion_holdout_after)
        self.promotion.between = self._judgement_turn
        self._judging = False  # a transformer candidate's judgement is in its turns
        self._refusals = 0  # promotion refusals in a row
        self._deep_version = 0  # bumped whenever the transformer's weights change
        self._good = self._capture()
        #: the clock of the time-based decisions (swap cadence, the promotion gate's share
        #: of time): the learning benchmark runs the trainer on its virtual clock
        self.clock: Callable[[], float] = time.monotonic
        self._swapped_at(self.clock())
        self._steps_since_swap = 0
        self._last_ckpt_step = step
        #: selective backprop's (rank, example) candidates not yet given to a step
        self._candidates: list[tuple[float, dict]] = []
        self._in_step = False  # a transformer step is between its chunks (`_turn`)
        self._turn_seconds = 0.0  # spent in the current step's turns
        #: called at each turn before the log is read (the learning benchmark feeds the
        #: signals of its virtual clock there); the daemon's log fills by itself
        self.before_turn: Callable[[], None] | None = None
        self.apply_settings(settings)

    def _install(self, model: Model, opt_state: dict | None, ewc_state: dict | None) -> None:
        """Take `model` as the training model, with a fresh AdamW and EWC on its backend,
        loaded from `opt_state` / `ewc_state` (host or device arrays) when given."""
        s = self.settings
        self.model = model
        self.opt = AdamW.for_model(model, lr=s.lr, weight_decay=s.weight_decay,
                                   clip_norm=s.clip_norm, warmup_steps=s.warmup_steps,
                                   cosine_steps=s.cosine_steps)
        if opt_state is not None:
            self.opt.load_state(opt_state["m"], opt_state["v"], opt_state["t"])
        self.wide_path.install(model, self.opt.v)
        xp = model.ops.xp
        model.ewc = EWC(model.num_params, lam=s.lambda_ewc, decay=s.ewc_decay, xp=xp,
                        dtype=str(model.dtype))
        if ewc_state:
            model.ewc.fisher[...] = xp.asarray(ewc_state["fisher"])
            model.ewc.anchor[...] = xp.asarray(ewc_state["anchor"])
            model.ewc.consolidated = bool(np.asarray(ewc_state["consolidated"])[0])

    def use_clock(self, clock: Callable[[], float]) -> None:
        """Time the swap cadence and the promotion gate's share by `clock` (seconds)."""
        self.clock = self.promotion.clock = clock
        self._swapped_at(clock())
        self.promotion._judged_at = float("-inf")

    @property
    def candidates_waiting(self) -> int:
        """Informative signals taken between a step's chunks, waiting for the next step."""
        return len(self._candidates)

    def use_cores(self, threads: int) -> None:
        """Run a CPU step's chunks `train.step_cores` at a time (0: `threads`, the trainer
        process's BLAS threads), each core with one BLAS thread (cores.py says why). The
        GPU keeps its one stream."""
        n = self.settings.step_cores or threads
        if self.model.ops.name != "numpy" or n < 2:
            return
        self.cores = ChunkCores(n)
        log.info("a training step's chunks run %d at a time, one per core", n)

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._loop()
        except Exception:
            log.exception("trainer thread crashed; the last checkpoint and every acknowledged "
                          "signal are kept, restart the daemon to resume")
            raise
        finally:
            self._final_checkpoint()
            if self.cores is not None:
                self.cores.close()

    def _loop(self) -> None:
        backoff = 0.0
        while True:
            try:
                self._loop_once_until_error()
                return
            except StoreError as e:
                # A full disk or map must not kill training for good: the signals are safe
                # in the log, so wait and retry from the last trained sequence number.
                backoff = min(30.0, max(1.0, backoff * 2))
                log.error("trainer: writing its state failed (%s); every acknowledged signal "
                          "is kept, retrying in %.0fs. Free disk space or raise the map "
                          "limit.", e, backoff)
                if self._stop_event.wait(backoff):
                    return
            except Exception as e:
                # Outside a step (scoring on the serving snapshot, a swap, a checkpoint's
                # read-back) a GPU failure is handled like one inside it; on the CPU an
                # exception is a bug and ends the thread as before.
                if not self._gpu_error(e, "training (outside a step)"):
                    raise

    def _loop_once_until_error(self) -> None:
        last_idle_step = 0.0
        while True:
            with self._settings_lock:
                pending, self._pending_settings = self._pending_settings, None
                rollback, self._pending_rollback = self._pending_rollback, None
            if pending is not None:
                self.apply_settings(pending[0])
                self.monitor.watch_allow_band(pending[1])
            if rollback is not None:
                self._apply_rollback(*rollback)
            s = self.settings
            if self._stop_event.is_set() and time.monotonic() >= self._drain_deadline:
                return
            if self.paused:
                if self._stop_event.is_set():
                    return
                self._wake.wait(timeout=1.0)
                self._wake.clear()
                continue
            fresh = self.store.read_signals(self.status.last_trained_seq, s.fresh_per_step)
            if fresh or self._candidates:
                self.train_on(fresh, turns=s.wide_turns)
                continue
            if self._stop_event.is_set():
                return
            self.publish_if_due()
            now = time.monotonic()
            budget = s.idle_steps_per_second
            if budget > 0 and self.store.reservoir_size() > 0 and \
                    now - last_idle_step >= 1.0 / budget:
                last_idle_step = now
                self.train_on([], turns=s.wide_turns)
                continue
            wait = 1.0 / budget - (now - last_idle_step) if budget > 0 else 1.0
            wait = min(wait, s.swap_every_seconds, 1.0)
            until_swap = self.next_swap_at - self.clock()
            if until_swap > 0:  # wake for a publication due sooner (`publish_soon`); one
                wait = min(wait, until_swap)  # overdue but not yet possible waits as before
            self._wake.wait(timeout=max(0.01, wait))
            self._wake.clear()

    def train_on(self, fresh: list[tuple[int, dict]], turns: bool = False) -> dict | None:
        """One step: take the fresh signals (scored, learnt by the wide path, kept for the
        transformer when informative), mix replay, train, maybe swap and checkpoint.

        With `turns` (the training loop's way on the CPU, `train.wide_turns`), the step
        stops after each of its chunks to take the signals that arrived meanwhile (`_turn`):
        the wide path learns them and is published seconds before the transformer's step
        ends, so predictions do not wait for it. Their informative ones wait for the next
        step (`_candidates`)."""
        s = self.settings
        self._scores = []  # bounded where nobody takes them (the daemon)
        pending = bool(self._candidates)
        if fresh:
            self._take(fresh)
        chosen = self._choose()
        if fresh or chosen:
            self.report_alignment(backpropagated=len(chosen))
        # The wide path has just learned from every fresh signal: publish that before the
        # transformer's step (seconds on a CPU), so predictions do not wait for it.
        self._maybe_swap(force=False)
        info = None
        # Stopping (SIGTERM): no transformer step, which on a CPU would outlast the stop
        # deadline; the wide path has learned these signals and they are in the reservoir,
        # like the ones selective backprop skips.
        stopping = self._stop_event.is_set()
        replay_only = not fresh and not pending
        if (chosen or replay_only) and not stopping:
            # Caught up, a batch is replay_fraction replayed examples; behind, fresh signals
            # take the replay slots first, so the trainer catches up instead of lagging more.
            share = s.drift_replay_fraction if self.monitor.adapting else s.replay_fraction
            n_replay = (s.batch_size if replay_only
                        else min(round(s.batch_size * share), s.batch_size - len(chosen)))
            replay = self.store.reservoir_sample(n_replay, self.rng) if n_replay > 0 else []
            taken = {ex["seq"] for ex in chosen}  # already in the reservoir: not twice
            replay = [ex for ex in replay if ex.get("seq") not in taken
                      and not self._set_aside(ex)]
            examples = chosen + self.latest.current(replay)
            if examples:
                info = self._step(examples, turns and self.model.ops.xp is np)
        if info is not None or fresh:
            self._maybe_swap(force=False)  # the wide path may have learned without a step
        if info is not None:
            if self.status.step - self._last_ckpt_step >= s.checkpoint_every_steps:
                self.checkpoint()
        return info

    def take_scores(self) -> list[tuple[int, float, float, float, bool]]:
        """The signals scored since the last `train_on` began or the last call, handed
        over once. Why a verb and not a list read after `train_on`: an idle trainer's
        `publish_if_due` may judge a candidate, and the judgement's turns take the
        signals that arrive meanwhile (`_judgement_turn`) -- a benchmark that read the
        scores only after steps lost them and compared the anchor with the wrong signals
        from there on (bench/bench_learning.py, seed 17: 87 of 11,448)."""
        scores, self._scores = self._scores, []
        return scores

    def _take(self, fresh: list[tuple[int, dict]]) -> None:
        """What every fresh signal gets, in order: progressive validation on the serving
        snapshot, the wide path's update, the promotion slice or the replay reservoir, and,
        when informative, a place among the transformer's candidates."""
        # `seq` lets the reservoir skip a signal it was already offered (a restart re-trains
        # what came after the last checkpoint); `fp` lets a newer signal for the same call
        # supersede the stored one.
        fresh_examples = [{**training_example(sig), "seq": seq,
                           "fp": context_fingerprint(sig["context"], sig.get("history"))}
                          for seq, sig in fresh]
        for ex in fresh_examples:
            ex["held"] = self.promotion.holds(ex)
            corrected = ex["feedback"] in CORRECTIONS
            if corrected:
                self.promotion.relabel(ex["fp"], ex["label"])
            # a newer signal (a correction, or the gate again) relabels its call's look
            self.wide_path.relabel(ex["fp"], ex["label"], corrected)
        self.latest.note(fresh_examples)  # before the wide path replays (`_wide_replay`)
        self._candidates += self._score(fresh_examples, [sig.get("served") for _, sig in fresh])
        self.promotion.add([ex for ex in fresh_examples if ex["held"]])
        self.status.last_trained_seq = fresh[-1][0]
        self.store.reservoir_add([ex for ex in fresh_examples if not ex["held"]], self.rng)

    def _turn(self) -> None:
        """Between two chunks of a transformer step: take what arrived meanwhile and publish
        the wide path's progress when a swap is due. The transformer's weights are
        untouched in the middle of a step (AdamW updates them after the last chunk), so the
        training weights are a whole candidate here, judged like any other."""
        t0 = time.perf_counter()
        if self.before_turn is not None:
            self.before_turn()
        fresh = self.store.read_signals(self.status.last_trained_seq,
                                        self.settings.fresh_per_step)
        if fresh:
            self._take(fresh)
            self.report_alignment()
        self._maybe_swap(force=False)
        self._turn_seconds += time.perf_counter() - t0

    def _choose(self) -> list[dict]:
        """Selective backprop: at most one batch of the candidates, corrections first, then
        the most informative; the others stay in the replay reservoir only."""
        self._candidates.sort(key=lambda t: t[0])
        chosen = [ex for _, ex in self._candidates[: self.settings.batch_size]]
        self._candidates = []
        return chosen

    def _score(self, fresh: list[dict], served: list[tuple[int, float] | None] | None = None
               ) -> list[tuple[float, dict]]:
        """Progressive validation of fresh examples on the serving snapshot, then selective
        backprop's candidates, ranked (lowest first).

        Candidates: every correction, every example the serving model gets wrong or is
        unsure of (calibrated probability of its label below `selective_confidence`), and a
        `selective_keep` sample of the rest, so the confident region keeps being rehearsed.
        A step takes at most one batch (`_choose`): corrections, then the most uncertain
        (p nearest 0.5; after a drift, the most wrong). The skipped ones are in the replay
        reservoir, and the wide path has learned from all of them. On a 2-core CPU this is
        what lets flint keep up with a gateway: most traffic is easy once learned.

        `served`: per signal, the transformer logit serving answered its call with and
        that transformer's token (`ServedDeep`); where the token is the serving snapshot's
        here, the logit is reused rather than computed again.
        """
        s = self.settings
        allow_open = bool(self.serving.calibration.allow_open)  # the band they are served
        # read as serving reads them now (unscaled n-grams while adapting: `familiar`)
        scored = self.serving.score_parts(
            source_batch([(e["context"], e["history"]) for e in fresh], self.model.cfg),
            served)
        self.status.scored_reused += scored.reused
        self.status.scored_computed += len(fresh) - scored.reused
        z, p, z_deep = scored.z, scored.p, scored.z_deep
        self.wide_path.learn(scored.sources, z_deep, fresh, self._wide_replay)
        hard: list[tuple[float, dict]] = []
        for zi, pi, zdi, ex in zip(z, p, z_deep, fresh, strict=True):
            self._scores.append((ex["seq"], float(pi), float(zi), float(zdi), allow_open))
            began = self.monitor.observe(ex["seq"], ex["fp"], ex["feedback"], ex["label"],
                                         float(zi), float(pi), tool_of(ex["context"]),
                                         float(zdi) if self.wide_path.learner is not None else 0.0,
                                         self.wide_path.block_weight(ex))
            if began is not None:
                self._on_drift(began, ex["seq"])
            self.apply_drift_verdicts()
            p_label = float(pi) if ex["label"] >= 0.5 else 1.0 - float(pi)
            if ex.get("held"):
                continue  # held back for the promotion gate: scored, never trained on
            if ex["label"] < 0.5 and p_label <= 0.5 and self.monitor.warm and (
                    pi < self.serving.bands.allow or ex["feedback"] in CORRECTIONS):
                self.publish_soon()  # a block serving leaned allow on, unsure: a lesson
            if ex["feedback"] in CORRECTIONS:
                hard.append((-1.0, ex))
            elif p_label < s.selective_confidence or self.rng.random() < s.selective_keep:
                # Uncertain first: a signal the model is SURE is wrong is, on a noisy gate,
                # most often the gate's mistake (its correction comes later and is always
                # trained); ranking those first taught the transformer the noise. After a
                # detected drift they are the new policy instead: then wrong first.
                hard.append((p_label if self.monitor.adapting else abs(float(pi) - 0.5), ex))
        cal = self.served_calibration()
        if cal != self.serving.calibration:
            self.serving.calibration = cal
        return hard

    def served_calibration(self) -> Calibration:
        """What serving should apply now: the monitor's Platt map, whether its
        progressive validation backs answering `allow` (`Monitor.allow_band_open`), and
        whether the wide path's n-grams are read scaled by their familiarity: not while
        its learner adapts to a drift alarm (the first
        `train.drift_wide_unscaled_examples` of its contradiction window)."""
        learner = self.wide_path.learner
        unscaled = learner is not None and learner.in_window_first(
            self.settings.drift_wide_unscaled_examples)
        return Calibration(*self.monitor.calibrator.params, self.monitor.allow_band_open,
                           not unscaled)

    def _wide_replay(self, n: int) -> tuple[list[dict], dict]:
        """`n` examples from the replay reservoir for the wide path to learn again
        (`WidePath.learn`, `train.wide_replay`), as the transformer's step draws them
        (uniform; superseded and relabelled by corrections, dropped after a drift,
        contradicted ones left out: `LatestLabels`), with their features. None with
        `wide_residual` (their transformer logits would cost a forward)."""
        if n <= 0 or self.settings.wide_residual:
            return [], {}
        replay = self.latest.current([ex for ex in self.store.reservoir_sample(n, self.rng)
                                      if not self._set_aside(ex)])
        if not replay:
            return [], {}
        return replay, source_batch([(e["context"], e["history"]) for e in replay],
                                    self.model.cfg)

    def converged(self) -> bool:
        return self.window.converged(self.settings.converged_threshold)

    def report_alignment(self, backpropagated: int = 0) -> None:
        self.events.on_scored(self.window, self.converged(), self.monitor.stats(),
                              backpropagated)

    def _step(self, examples: list[dict], turns: bool = False) -> dict | None:
        t0 = time.perf_counter()
        self._turn_seconds = 0.0  # the step's time is reported without its turns
        self.model.ewc.lam = 0.0 if self.monitor.adapting else self.settings.lambda_ewc
        batch = build_batch(examples, self.model.cfg)
        try:
            self._in_step = turns
            info = train_step(self.model, self.opt, batch,
                              chunk_rows=step_chunk_rows(self.settings, turns),
                              between_chunks=self._turn if turns else None, cores=self.cores)
            finite = bool(info["finite"]) and self.model.ops.all_finite(self.model.flat)
        except Exception as e:
            # The examples are not retried: the fresh ones are in the replay reservoir,
            # as after a non-finite step.
            if not self._gpu_error(e, "a training step"):
                raise
            return None
        finally:
            self._in_step = False
        self._gpu_failures = 0
        if not finite:
            self._rollback("non-finite loss, gradient or weights")
            return info
        self.status.step += 1
        self._deep_version += 1
        self._steps_since_swap += 1
        self.status.last_loss = {k: info[k] for k in ("loss", "bce", "ce", "grad_norm", "lr")}
        self.events.on_step(info, time.perf_counter() - t0 - self._turn_seconds)
        self.store.append_metrics(self.status.step, {
            **self.status.last_loss, "alignment": self.window.alignment, "t": time.time()})
        return info
