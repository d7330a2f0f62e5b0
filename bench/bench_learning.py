"""Learning benchmark: the real trainer on realistic gateway traffic, scored against the
TRUE label, beside an online hashed n-gram logistic regression (DESIGN.md section 6).

The stream (gated.traffic): MCP-style tool calls of 11 tools from interleaved agent
sessions that pass their history, 12 block categories (one depends on the history: an
outbound POST or e-mail after the session read a secret), a gate that is wrong ~6% of
the time with ~80% of its mistakes corrected 5-50 signals later, and a policy change
that flips ~22% of traffic at `--switch-at`.

gated runs as the daemon runs it: the daemon's `Trainer` (real LMDB store in a temp dir,
real replay reservoir, serving snapshot, swaps, calibration, drift detection), stepped on
a VIRTUAL clock: signals arrive at `--rate` per second of virtual time and each step
advances the clock by its measured wall time, so a slow machine sees more signals per
step, exactly as the daemon would; the queue (arrived, not yet trained) is recorded. The
trainer times its swaps by that clock (`Trainer.use_clock`), publishes while idle as the
daemon's loop does, and at its turns between a step's chunks (`train.wide_turns`) takes
the signals that arrived so far in the step.
Every ordinary signal is scored by the serving model before it is trained on
(progressive validation) and compared with the TRUE label, never with the noisy gate.
As in the daemon (`[serving] served_logits`), the gateway's `predict` of each ordinary
call comes first, off the virtual clock (serving's own process there), and the signal
carries the transformer logit it was answered with, which the trainer's scoring reuses
when its transformer is the same (`--served-logits off`: computed again, as before).

The anchor sees the same signals with no time budget (it learns from every one, as
fast as it likes), the same labels (gate decisions and corrections) and the same
history. Probes, evaluated off the clock at each checkpoint: calls built only from
held-out values (unseen hosts, paths, tables, ...) and history-rule pairs (the same
outbound call with and without a secret read 1-10 calls back).

    .venv/bin/python bench/bench_learning.py --write
    .venv/bin/python bench/bench_learning.py --lr 3e-4 1e-3 2e-3 --signals 4000  # sweep
    .venv/bin/python bench/bench_learning.py --variant v1 --variant v2 --section ablation --write
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from anchor import HashedNgramLR, anchor_text, label_weight  # noqa: E402
from docs_section import section_suffix_error  # noqa: E402
from learning_report import TABLE_HEAD, by_category, row_text, summary  # noqa: E402

from gated.config import TrainConfig  # noqa: E402
from gated.config.schema import ServingConfig  # noqa: E402
from gated.daemon.serving import ServedDeep  # noqa: E402
from gated.daemon.trainer import TrainerEvents, build_trainer  # noqa: E402
from gated.engine import ModelConfig, source_batch  # noqa: E402
from gated.online import brier_score, expected_calibration_error  # noqa: E402
from gated.signals import validate_signal  # noqa: E402
from gated.store import Store  # noqa: E402
from gated.traffic import GatewayTraffic  # noqa: E402

CHECK_EVERY = 500
#: Set by SIGTERM (`timeout`, a device call's deadline): the stream ends after the next
#: signal, as a shorter stream would, and the run prints its last checkpoint and its
#: summary instead of dying with neither (2026-11-28: four GPU runs cut by their
#: `timeout` at ~6,500 of 8,000 signals left their tables without a summary).
STOP = threading.Event()
#: Model variants for the ablation (DESIGN.md section 1's revision).
VARIANTS = {
    "v2": {},  # format 2 + the wide path: the default
    "v2-no-pair": {"wide_pair_rank": 0},  # the wide path without its call x history pair term
    "v2-no-shapes": {"wide_call_shapes": 0.0},  # the wide path without the argument shapes
    "v2-no-known": {"wide_known_names": 0.0},  # ... without the known-package-name marks
    "v2-no-sensitive": {"wide_sensitive_files": 0.0},  # ... without the sensitive-file marks
    # the sensitive-file marks at 2.0 without the egress mark (docs/learning.md)
    "v2-sensitive-2": {"wide_sensitive_files": 2.0, "wide_egress_calls": 0.0},
    # ... and the egress mark on the pair term's call side (docs/learning.md, "Egress calls";
    # the default from 2026-11-24, afternoon, to 2026-11-25: these values spelled out)
    "v2-egress": {"wide_sensitive_files": 2.0, "wide_egress_calls": 1.0},
    "v2-no-egress": {"wide_egress_calls": 0.0},  # ... without the egress mark
    # the marks as before that afternoon (sensitive files at 1.0, no egress mark)
    "v2-sensitive-1": {"wide_sensitive_files": 1.0, "wide_egress_calls": 0.0},
    # the pair term's history keys summed, not pooled (keys are per entry since 2026-11-24:
    # a file read twice counts twice, where the sum before deduplicated the history)
    "v2-sum-pair": {"wide_pair_pool": 0.0},
    # the pair term's call side initialised at 0.3, not 0.1 (docs/learning.md, "The wide
    # path's rate"; with --set wide_lr=... --set wide_l2=... for that section's rows)
    "v2-pair-init-0.3": {"wide_pair_init": 0.3},
    # the history as a veto, c = 2 (docs/learning.md, "The history as a veto"; not kept)
    "v2-veto-2": {"wide_pair_veto": 2.0},
    # the raw pair term, before it was bounded to speak only for "block" (docs/learning.md,
    # "The history speaks only for block")
    "v2-raw-pair": {"wide_pair_block_only": False},
    # the n-grams read scaled by f ** 8, f their familiarity (docs/learning.md, "A
    # familiarity-scaled n-gram part")
    "v2-familiar-8": {"wide_familiarity": 8.0},
    "v2-no-familiar": {"wide_familiarity": 0.0},  # ... read as they are (before 2026-11-30)
    # a first-seen destination mark of value 1 after the domain key (docs/learning.md, "A
    # first-seen destination", "New hosts in the stream, ..."; the default since 2026-11-30,
    # "The first-seen mark made the default": then the same as v2)
    "v2-novel": {"wide_novel_destinations": 1.0},
    "v2-no-novel": {"wide_novel_destinations": 0.0},  # ... without it (before 2026-11-30)
    # the encoding before the change with today's wide path: its byte n-grams then mix the
    # history into the call's (one segment); the structured features and the pair term read
    # the call and its history apart whatever the encoding, so this measures the encoding
    "v1": {"source_format": 1},
    "v2-deep": {"wide_buckets": 0},  # format 2, transformer only
    "v1-deep": {"source_format": 1, "wide_buckets": 0},  # the encoding before the change
}


def _acc(p: list[float], y: list[bool]) -> float:
    return float(np.mean([(pi >= 0.5) == yi for pi, yi in zip(p, y, strict=True)])) if p else 0.0


def _recall_block(p: list[float], y: list[bool]) -> float:
    blocks = [pi < 0.5 for pi, yi in zip(p, y, strict=True) if not yi]
    return float(np.mean(blocks)) if blocks else float("nan")


def _recall_allow(p: list[float], y: list[bool]) -> float:
    allows = [pi >= 0.5 for pi, yi in zip(p, y, strict=True) if yi]
    return float(np.mean(allows)) if allows else float("nan")


class Probes:
    """Held-out-value probes and history-rule pairs, TRUE-labelled, regenerated under the
    policy in force."""

    def __init__(self, traffic: GatewayTraffic, n: int, seed: int) -> None:
        self.traffic, self.n, self.seed = traffic, n, seed
        self._cache: dict[str, tuple[list, list]] = {}

    def sets(self) -> tuple[list, list]:
        pol = self.traffic.policy
        if pol not in self._cache:
            self._cache[pol] = (self.traffic.probes(self.n, self.seed),
                                self.traffic.history_probes(self.n, self.seed + 1))
        return self._cache[pol]

    def changed_share(self) -> float | None:
        """The share of the unseen-value probes whose TRUE label the policy change flipped
        (the same calls under both policies: `probes` draws them from the seed alone), or
        None before a change. A learner still answering every probe as the old policy did
        scores at most 1 - this, whatever it learned: the checkpoint right after the change
        measures how much of the new policy a few dozen of its signals taught."""
        if len(self._cache) < 2:
            return None
        old, new = (self._cache[p][0] for p in list(self._cache)[:2])
        return float(np.mean([a.true_allow != b.true_allow for a, b in zip(old, new,
                                                                           strict=True)]))

    def evaluate(self, predict, parts=None) -> dict[str, float]:
        """Accuracy of `predict` (items -> p_allow) on both sets. With `parts` (items ->
        p_allow, raw logits z, their transformer part, that part's mean on the stream's
        last 500, and the trainer's live wide logit -- the weights its wide path is
        stepping, not yet published: one forward) both sets are scored by it instead.
        The unseen probes are also decided by z >= 0 (before calibration: an unseen
        value's logit is near 0, so Platt's intercept can decide it) and by the wide part
        alone, the transformer's held at its stream mean (does the transformer's part
        swing them?). With a standalone wide path (`wide_residual = false`) the wide part
        has its own bias, so that mean shifts it: then the column is a diagnostic, not its
        decision. The history pairs are also decided by z >= 0, by the serving wide logit
        alone and by the live one (where between learning and serving the rule is lost)."""
        unseen, hist = self.sets()
        items_u = [(e.signal["context"], e.signal.get("history")) for e in unseen]
        items_h = [(e.signal["context"], e.signal.get("history")) for e in hist]
        if parts is None:
            pu, ph = predict(items_u), predict(items_h)
        else:
            pu, z, z_deep, deep_mean, _ = parts(items_u)
            ph, zh, zh_deep, _, zh_live = parts(items_h)
        yu = [e.true_allow for e in unseen]
        yh = [e.true_allow for e in hist]
        out = {"unseen": _acc(list(pu), yu), "unseen_block_recall": _recall_block(list(pu), yu),
               "history": _acc(list(ph), yh), "unseen_by_category": {},
               # the pairs' two members apart: the secret read in the window (blocked by
               # the rule) and its twin with a benign read (allowed)
               "history_block": _recall_block(list(ph), yh),
               "history_twins": _recall_allow(list(ph), yh)}
        for cat in sorted({e.category for e in unseen}):
            rows = [i for i, e in enumerate(unseen) if e.category == cat]
            out["unseen_by_category"][cat] = (len(rows), _acc([pu[i] for i in rows],
                                                              [yu[i] for i in rows]))
        if parts is not None:
            out["unseen_raw"] = _acc([float(x >= 0) for x in z], yu)
            out["unseen_wide"] = _acc([float(x >= 0) for x in z - z_deep + deep_mean], yu)
            out["history_raw"] = _acc([float(x >= 0) for x in zh], yh)
            out["history_wide"] = _acc([float(x >= 0) for x in zh - zh_deep], yh)
            out["history_live"] = _acc([float(x >= 0) for x in zh_live], yh)
        return out


def run(preset: str, lr: float, rate: float, n_signals: int, switch_at: int, seed: int,
        variant: str = "v2", probes: int = 200, settings_kw: dict | None = None,
        backend: str = "numpy", trace: str | None = None, fresh_hosts: float = 0.0,
        served_logits: bool = True) -> dict:
    cfg = dataclasses.replace(ModelConfig.preset(preset), **VARIANTS[variant])
    settings = dataclasses.replace(TrainConfig(), lr=lr, **(settings_kw or {}))
    traffic = GatewayTraffic(seed=seed, fresh_hosts=fresh_hosts)
    probe = Probes(GatewayTraffic(seed=seed), probes, seed + 1000)
    anchor = HashedNgramLR()
    if backend != "numpy":
        # What the daemon's GPU start-up does before it trains (gated/device.py,
        # daemon/trainer_process.py): compile the engine's kernels, fill the memory pool
        # with one dry step of the largest batch, and rehearse the trainer's path on
        # throwaway state, so that the virtual clock bills the first signals for none of it.
        from gated.daemon.trainer.rehearsal import rehearse
        from gated.device import reserve_training_memory
        from gated.engine.model import get_ops

        get_ops(backend).warmup()
        reserve_training_memory(cfg, settings.batch_size)
        done = rehearse(cfg, settings, backend)
        print(f"(rehearsal before the clock: {done['steps']} steps, {done['swaps']} swaps, "
              f"{done['seconds']:.1f} s)", flush=True)
    with tempfile.TemporaryDirectory(prefix="gated-learn-") as tmp:
        store = Store(tmp)
        trainer, serving = build_trainer(store, cfg, settings, seed=seed, backend=backend)
        trainer.events = drifts = DriftLog(lambda: trainer.status.last_trained_seq)
        if served_logits:  # as the daemon: [serving] served_logits
            serving.served = ServedDeep(ServingConfig().served_logits)
        events: dict[int, object] = {}  # seq -> Event
        anchor_p: dict[int, float] = {}  # seq -> the anchor's p_allow before it learned it
        scored: list[tuple[float, bool]] = []  # gated (p, true_allow), ordinary signals
        served_open: list[bool] = []  # was the allow band open when each was scored
        switch_index: int | None = None  # index in `scored` of the first v2 signal
        anchored: list[tuple[float, bool]] = []  # the anchor's (p, true_allow), paired
        raw: list[tuple[float, bool]] = []  # gated before calibration (p >= 0.5 iff z >= 0)
        parts: list[tuple[float, float, bool]] = []  # (wide part, transformer part, TRUE)
        rows, queue_trace = [], []
        clock, produced, steps, trained_examples = 0.0, 0, 0, 0
        next_check = CHECK_EVERY
        max_queue = 0
        stopped_at: tuple[int, int] | None = None  # (signals produced, asked for) on SIGTERM
        # --trace: one JSON line per ordinary signal scored (why a checkpoint was lost)
        trace_file = open(trace, "w", buffering=1) if trace else None  # noqa: SIM115

        def produce(now: float) -> None:
            """Append the signals due by virtual time `now` (the anchor sees each as it
            arrives: it predicts, then learns)."""
            nonlocal produced, t0
            due = min(n_signals, int(now * rate) + 1)
            if due <= produced:
                return
            batch, evs, anchor_ps = [], [], []
            for _ in range(due - produced):
                if produced == switch_at:
                    traffic.policy = "v2"
                    probe.traffic.policy = "v2"
                ev = traffic.next()
                evs.append(ev)
                batch.append(ev.signal)
                produced += 1
                text = anchor_text(ev.signal["context"], ev.signal.get("history"))
                anchor_ps.append(anchor.predict_proba(text))
                y, w = label_weight(ev.signal)
                anchor.learn(text, y, w)
            if served_logits:
                # The gateway asked serving before each call (not before a correction):
                # the daemon's serving process, not the trainer, so off the virtual clock.
                # Its transformer logits ride on the signals (`ServedDeep`).
                t_served = time.perf_counter()
                asked = [(ev.signal["context"], ev.signal.get("history")) for ev in evs
                         if not ev.is_correction]
                if asked:
                    serving.predict_many(asked)
                batch = [validate_signal(sig) for sig in batch]
                serving.served.attach(batch)
                t0 += time.perf_counter() - t_served
            for ev, pa, (seq, _dup) in zip(evs, anchor_ps,
                                            store.append_signals(batch,
                                                                 validated=served_logits),
                                            strict=True):
                events[seq] = ev
                anchor_p[seq] = pa

        t0 = time.perf_counter()  # wall time at the start of the current train_on
        step_clock = 0.0  # virtual time then

        def virtual_now() -> float:
            return step_clock + time.perf_counter() - t0
        # The trainer times its swaps by the virtual clock (a real one would count the
        # probes' evaluation and not the time the stream skips while the trainer is idle),
        # and its turns (between the chunks of a step) see the signals that arrived so far
        # in the step, as in the daemon, where the log fills while the trainer works.
        trainer.use_clock(virtual_now)
        trainer.before_turn = lambda: produce(virtual_now())
        while True:
            if STOP.is_set() and stopped_at is None and produced + 1 < n_signals:
                # one more signal, so that the stream ends as every stream does: its last
                # train_on makes the last checkpoint
                stopped_at, n_signals = (produced + 1, n_signals), produced + 1
                print(f"(stopped by SIGTERM after {n_signals} of {stopped_at[1]} signals: "
                      f"the last checkpoint and the summary cover what ran)", flush=True)
            produce(clock)
            fresh = store.read_signals(trainer.status.last_trained_seq, settings.fresh_per_step)
            if not fresh and not trainer.candidates_waiting:
                if produced >= n_signals:
                    break
                # idle until the next signal is due: the daemon's loop publishes meanwhile,
                # as soon as a swap is due
                arrival = produced / rate
                t0 = time.perf_counter()
                step_clock = max(clock, min(arrival, trainer.next_swap_at))
                trainer.publish_if_due()
                clock = max(arrival, virtual_now())
                # a judgement there takes turns, which score the signals arriving meanwhile
                scores = trainer.take_scores()
                if not scores:
                    continue
            else:
                t0, step_clock = time.perf_counter(), clock
                info = trainer.train_on(fresh, turns=settings.wide_turns)
                clock += time.perf_counter() - t0
                steps += info is not None
                scores = trainer.take_scores()
            for seq, p, z, z_deep, allow_open in scores:
                ev = events.pop(seq)
                pa = anchor_p.pop(seq)
                if not ev.is_correction:
                    if switch_index is None and seq > switch_at:  # seqs are 1-based
                        switch_index = len(scored)
                    scored.append((p, ev.true_allow))
                    anchored.append((pa, ev.true_allow))
                    served_open.append(allow_open)
                    raw.append((float(z >= 0), ev.true_allow))
                    parts.append((z - z_deep, z_deep, ev.true_allow))
                    if trace_file is not None:
                        trace_file.write(json.dumps({
                            "seq": seq, "t": round(clock, 3), "steps": steps,
                            "version": trainer.serving.current.version,
                            "trained_seq": trainer.status.last_trained_seq, "p": p,
                            "z": z, "z_deep": z_deep, "anchor_p": pa,
                            "true_allow": ev.true_allow, "context": ev.signal["context"],
                            "history": ev.signal.get("history"), "allow_open": allow_open,
                            "decision": ev.signal.get("decision"),
                            "category": ev.category}) + "\n")
            queue = produced - trainer.status.last_trained_seq
            max_queue = max(max_queue, queue)
            if len(scored) >= next_check or (produced >= n_signals and not events):
                n = len(scored)
                g = scored[-CHECK_EVERY:]
                a = anchored[n - CHECK_EVERY: n] if n >= CHECK_EVERY else anchored[:n]
                deep_mean = float(np.mean([d for _, d, _ in parts[-CHECK_EVERY:]]))

                def scored_parts(items, deep_mean=deep_mean):
                    # read as serving reads them (unscaled n-grams while adapting); p is
                    # predict_many's
                    s = serving.score_parts(source_batch(items, cfg))
                    return (s.p, s.z, s.z_deep, deep_mean, trainer.model.wide_logit(s.sources))
                pr_g = probe.evaluate(lambda items: serving.predict_many(items)[0],
                                      scored_parts)
                pr_a = probe.evaluate(lambda items: [anchor.predict_proba(anchor_text(c, h))
                                                     for c, h in items])
                rows.append({
                    # `signals`: the stream's position (corrections included, the unit of
                    # `switch_at`; the probes' policy is the stream's there)
                    "n": n, "signals": produced, "policy": traffic.policy,
                    "virtual_s": round(clock, 1),
                    "queue": queue, "steps": steps,
                    "gated": _acc(*zip(*g, strict=True)),
                    "gated_uncalibrated": _acc(*zip(*raw[-CHECK_EVERY:], strict=True)),
                    **_parts_alone(parts[-CHECK_EVERY:]),
                    "anchor": _acc(*zip(*a, strict=True)),
                    **_paired(g, a),
                    "gated_block_recall": _recall_block(*zip(*g, strict=True)),
                    "probe_unseen": pr_g["unseen"], "probe_unseen_anchor": pr_a["unseen"],
                    "probe_unseen_raw": pr_g["unseen_raw"],
                    "probe_unseen_wide": pr_g["unseen_wide"],
                    "probe_unseen_block_recall": pr_g["unseen_block_recall"],
                    "probe_history": pr_g["history"], "probe_history_anchor": pr_a["history"],
                    "probe_history_block": pr_g["history_block"],
                    "probe_history_twins": pr_g["history_twins"],
                    "probe_history_raw": pr_g["history_raw"],
                    "probe_history_wide": pr_g["history_wide"],
                    "probe_history_live": pr_g["history_live"],
                    "unseen_by_category": {c: (n, acc, pr_a["unseen_by_category"][c][1])
                                           for c, (n, acc) in pr_g["unseen_by_category"].items()},
                    **{k: round(v, 4) for k, v in trainer.monitor.stats().items()},
                })
                print(row_text(rows[-1]), flush=True)
                next_check += CHECK_EVERY
                if produced >= n_signals and not events:
                    break
            queue_trace.append((round(clock, 1), queue))
        if events:  # every signal is scored once: a checkpoint would compare the wrong ones
            raise RuntimeError(f"{len(events)} signals of the stream were never scored "
                               f"(first {min(events)}): the rows above are not paired")
        trained_examples = trainer.status.step
        store.close()
        if trace_file is not None:
            trace_file.close()
    # calibration and allow-band precision against the TRUE label, last 2000 scored; the
    # allow band as served (closed until enough signals are scored and after a drift alarm)
    tail = scored[-2000:]
    p = np.array([x for x, _ in tail])
    y = np.array([float(t) for _, t in tail])
    allow_band = y[(p >= serving.bands.allow) & np.array(served_open[-2000:], dtype=bool)]
    return {"preset": preset, "variant": variant, "lr": lr, "rows": rows, "steps": steps,
            "virtual_s": round(clock, 1), "max_queue": max_queue, "stopped_at": stopped_at,
            "final_queue": queue_trace[-1][1] if queue_trace else 0,
            "ece_true": expected_calibration_error(p, y), "brier_true": brier_score(p, y),
            "allow_band_precision": float(allow_band.mean()) if allow_band.size else float("nan"),
            "allow_band_share": float(allow_band.size / max(1, p.size)),
            "allow_band_phases": _allow_band_phases(scored, served_open, switch_index,
                                                    serving.bands.allow),
            "allow_band_wait": (settings.allow_band_after, settings.allow_band_drift_hold),
            "switch_at": switch_at, "trained_steps": trained_examples,
            "drifts": drifts.verdicts, "probes_changed": probe.changed_share(),
            "scored_reused": (trainer.status.scored_reused, trainer.status.scored_computed)}


class DriftLog(TrainerEvents):
    """The drift alarms' verdicts: (change estimated at, confirmed, replay dropped, the
    trainer's position in the stream at the alarm, at the verdict). Why the positions: a
    dip inside an alarm's window reads differently before and after its verdict, and the
    trace alone does not say when either came (docs/learning.md, "A withdrawn alarm gives
    its sums back")."""

    def __init__(self, position: Callable[[], int]) -> None:
        self.position = position
        self.alarmed_at: dict[int, int] = {}
        self.verdicts: list[tuple[int, bool, int, int, int]] = []

    def on_drift(self, began_seq: int) -> None:
        self.alarmed_at[began_seq] = self.position()

    def on_drift_verdict(self, began_seq: int, confirmed: bool, dropped: int) -> None:
        self.verdicts.append((began_seq, confirmed, dropped,
                              self.alarmed_at.get(began_seq, -1), self.position()))


def _allow_band_phases(scored: list[tuple[float, bool]], served_open: list[bool],
                       switch_index: int | None, allow: float) -> dict[str, tuple]:
    """TRUE blocks answered `allow`, and calls answered `allow`, in the first 500 scored,
    the 500 after the policy change and the rest: as served (the allow band closed while
    the trainer's evidence does not back it) and with the band always open."""
    p = np.array([x for x, _ in scored])
    y = np.array([t for _, t in scored], dtype=bool)
    opened = np.array(served_open, dtype=bool)
    phase = np.full(p.size, "rest", dtype=object)
    phase[:500] = "first 500"
    if switch_index is not None:
        phase[switch_index:switch_index + 500] = "500 after the change"
    out = {}
    for name in ("first 500", "500 after the change", "rest"):
        sel = phase == name
        band = sel & (p >= allow)
        out[name] = (int((band & opened & ~y).sum()), int((band & opened).sum()),
                     int((band & ~y).sum()), int(band.sum()), int(sel.sum()))
    return out


def _gpu_name() -> str:
    """The GPU the cupy backend runs on (for the heading and the machine line)."""
    import cupy

    from gated.device import device_name

    return device_name(cupy.cuda.runtime, 0)


def setting_value(kind: type, text: str, option: str = "--set"):
    """A KEY=VALUE option's value as its field's type (bool("false") would be True)."""
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise SystemExit(f"{option}: {text!r} is not true or false")
        return text.lower() in ("true", "1")
    try:
        return kind(text)
    except ValueError:
        raise SystemExit(f"{option}: {text!r} is not of type {kind.__name__}") from None


def field_overrides(config: type, pairs: list[str], option: str) -> dict:
    """`option KEY=VALUE` pairs as overrides of the dataclass `config`, each value of its
    field's type; a clear exit, not a traceback, for a pair without `=`, a key that is not
    a field, or a value of the wrong type."""
    default = config()
    fields = {f.name for f in dataclasses.fields(config)}
    out = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or key not in fields:
            raise SystemExit(f"{option}: {pair!r} is not KEY=VALUE of a {config.__name__} "
                             "field")
        out[key] = setting_value(type(getattr(default, key)), text, f"{option} {key}")
    return out


def _paired(g: list[tuple[float, bool]], a: list[tuple[float, bool]]) -> dict[str, int]:
    """On the same signals (both lists are the ordinary signals in stream order): how many
    gated decided right where the anchor was wrong (`wins`) and the reverse (`losses`).
    A difference of one checkpoint is a difference of a few such signals; McNemar's test
    says whether it is more than chance (`summary`)."""
    right_g = [(p >= 0.5) == y for p, y in g]
    right_a = [(p >= 0.5) == y for p, y in a]
    return {"wins": sum(x and not z for x, z in zip(right_g, right_a, strict=True)),
            "losses": sum(z and not x for x, z in zip(right_g, right_a, strict=True))}


def _parts_alone(window: list[tuple[float, float, bool]]) -> dict[str, float]:
    """Alignment of the serving logit with one part held at its mean over the window:
    does the other part's variation decide calls right? (The split of the bias between
    the parts is arbitrary, so a part alone, uncentred, says nothing.)"""
    wide, deep, y = (np.array(c, dtype=float) for c in zip(*window, strict=True))
    return {"wide_alone": float(np.mean((wide + deep.mean() >= 0) == (y > 0.5))),
            "deep_alone": float(np.mean((deep + wide.mean() >= 0) == (y > 0.5)))}



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="flint")
    ap.add_argument("--lr", type=float, nargs="+", default=[TrainConfig().lr])
    ap.add_argument("--variant", action="append", choices=sorted(VARIANTS))
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--signals", type=int, default=8000)
    ap.add_argument("--switch-at", type=int, default=4500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--probes", type=int, default=200)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a [train] setting, e.g. --set batch_size=8")
    ap.add_argument("--backend", default="numpy", choices=("numpy", "cupy"),
                    help="the trainer's and the serving snapshot's engine (cupy: the GPU)")
    ap.add_argument("--trace", default=None, metavar="FILE",
                    help="write one JSON line per ordinary signal scored (p, z, its "
                         "transformer part, steps so far, the TRUE label)")
    ap.add_argument("--fresh-hosts", type=float, default=0.0, metavar="SHARE",
                    help="the share of the stream's outside hosts that are new (never seen; "
                         "GatewayTraffic.fresh_hosts); the probes are unchanged")
    ap.add_argument("--served-logits", default="on", choices=("on", "off"),
                    help="on (the daemon's default): each ordinary signal's call is "
                         "predicted first, off the virtual clock (serving's process), and "
                         "its transformer logit rides on the signal for the trainer to "
                         "reuse; off: the trainer computes every logit again, as before "
                         "b54c78b")
    ap.add_argument("--write", action="store_true", help="record in docs/benchmarks.md")
    ap.add_argument("--section", default=None, help="heading suffix for docs/benchmarks.md")
    a = ap.parse_args()
    if (bad := section_suffix_error("Learning", a.section)) is not None:
        ap.error(bad)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: STOP.set())
    overrides = field_overrides(TrainConfig, a.set, "--set")  # [train] settings
    machine = (f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores, Python "
               f"{platform.python_version()}, numpy {np.__version__}"
               + ("" if a.backend == "numpy" else f", engine on {_gpu_name()} (cupy)"))
    if a.backend == "numpy":  # the trainer's step rate depends on it (docs_section.speed_probe)
        from docs_section import speed_probe

        machine += f"; {speed_probe()}"
    head = (f"Machine: {machine}. Stream: gated.traffic seed {a.seed}, {a.signals} signals "
            f"at {a.rate:g}/s of virtual time, policy v1 -> v2 after {a.switch_at}"
            + (f", {a.fresh_hosts:g} of its outside hosts new" if a.fresh_hosts else "") + ".")
    print(head, flush=True)
    out = [head, ""]
    for variant in a.variant or ["v2"]:
        for lr in a.lr:
            if STOP.is_set():
                break  # SIGTERM: the run it cut short has printed its summary
            title = (f"{a.preset}, {variant}, lr {lr:g}" + "".join(f", {kv}" for kv in a.set)
                     + (", served logits off" if a.served_logits == "off" else ""))
            print(f"\n### {title}\n\n{TABLE_HEAD}", flush=True)
            t0 = time.time()
            r = run(a.preset, lr, a.rate, a.signals, a.switch_at, a.seed, variant, a.probes,
                    settings_kw=overrides, backend=a.backend, trace=a.trace,
                    fresh_hosts=a.fresh_hosts, served_logits=a.served_logits == "on")
            reused, computed = r["scored_reused"]
            lines = summary(r) + [
                f"- the trainer scored {reused:,} fresh signals with the transformer logit "
                f"served for their call and ran the transformer again for {computed:,}"
            ] + [""] + by_category(r)
            print("\n".join(lines), f"\n(wall {time.time() - t0:.0f} s)", flush=True)
            out += [f"### {title}", "", TABLE_HEAD,
                    *(row_text(x) for x in r["rows"]), "", *lines, ""]
    if a.write:
        from docs_section import write_section

        where = "CPU" if a.backend == "numpy" else f"GPU {_gpu_name()}"
        heading = f"## Learning ({a.preset}, {where}{', ' + a.section if a.section else ''})"
        cmd = " ".join(["`.venv/bin/python", "bench/bench_learning.py", *sys.argv[1:]]) + "`"
        write_section(heading, f"{heading}\n\nCommand: {cmd}\n\n" + "\n".join(out))


if __name__ == "__main__":
    main()
