"""Prometheus series of the daemon (DESIGN section 5; meanings in docs/operations.md).

Every series is prefixed ``gated_`` and in base units (seconds, ratios in 0..1, unix
seconds for timestamps). Labels are bounded: each labelled series lists its label values
up front (and pre-creates them at 0, so ``rate()`` works from the first scrape and a
dashboard shows a zero instead of "no data"); anything else maps to ``other``.

:class:`Metrics` owns its own ``CollectorRegistry`` rather than the process-global one,
so tests (and a process embedding two daemons) can build as many as they like.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.process_collector import ProcessCollector

from .. import __version__
from ..protocol import ERROR_CODES, OPS
from .metrics_http import MetricsServer, start_http_server

#: Latency buckets in seconds: 50 us (a cached tiny-model predict) .. 10 s (a flint
#: training step on a slow CPU).
LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
                   0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

CONFUSION_CELLS = ("tp", "fp", "tn", "fn")
REJECT_REASONS = (*ERROR_CODES, "other")
PREDICT_OPS = ("predict", "explain")
RELOAD_RESULTS = ("ok", "failed")
DEVICE_MEMORY_KINDS = ("total", "free", "estimate", "reserved")
#: Why the daemon closed a connection itself (bounds across connections).
DROP_REASONS = ("max_connections", "buffered_bytes", "read_timeout")
#: Ops an [access] list can refuse (ping is open to all).
GUARDED_OPS = tuple(op for op in OPS if op != "ping")

#: Every series a scrape exposes, with its type: sample names as in the text format
#: (counters end in ``_total``, infos in ``_info``; a histogram's name is the stem of its
#: ``_bucket``/``_sum``/``_count`` samples).
#: docs/operations.md documents each; tests check both against a real scrape.
SERIES: dict[str, str] = {
    "gated_loss": "gauge",
    "gated_loss_bce": "gauge",
    "gated_loss_ce": "gauge",
    "gated_alignment": "gauge",
    "gated_alignment_window_signals": "gauge",
    "gated_converged": "gauge",
    "gated_confusion": "gauge",
    "gated_alignment_corrected": "gauge",
    "gated_calibration_ece": "gauge",
    "gated_calibration_brier": "gauge",
    "gated_calibration_platt": "gauge",
    "gated_drift_detections_total": "counter",
    "gated_drift_withdrawn_total": "counter",
    "gated_drift_adapting": "gauge",
    "gated_allow_band_open": "gauge",
    "gated_wide_familiar": "gauge",
    "gated_replay_dropped_total": "counter",
    "gated_signals_backpropagated_total": "counter",
    "gated_scored_reused_share": "gauge",
    "gated_train_steps_total": "counter",
    "gated_learning_rate": "gauge",
    "gated_grad_norm": "gauge",
    "gated_signals_received_total": "counter",
    "gated_signals_rejected_total": "counter",
    "gated_signals_scored_total": "counter",
    "gated_queue_depth": "gauge",
    "gated_weights_version": "gauge",
    "gated_swaps_total": "counter",
    "gated_rollbacks_total": "counter",
    "gated_checkpoint_timestamp_seconds": "gauge",
    "gated_step_duration_seconds": "histogram",
    "gated_predict_duration_seconds": "histogram",
    "gated_backend_info": "info",
    "gated_gpu_fallbacks_total": "counter",
    "gated_device_memory_bytes": "gauge",
    "gated_config_reloads_total": "counter",
    "gated_build_info": "info",
    "gated_trainer_restarts_total": "counter",
    "gated_trainer_up": "gauge",
    "gated_predict_cache_lookups_total": "counter",
    "gated_predict_cache_entries": "gauge",
    "gated_predict_batch_size": "histogram",
    "gated_promotions_total": "counter",
    "gated_operator_rollbacks_total": "counter",
    "gated_tool_alignment": "gauge",
    "gated_tool_signals": "gauge",
    "gated_tool_confusion": "gauge",
    "gated_tool_calibration_ece": "gauge",
    "gated_promotion_holdout_alignment": "gauge",
    "gated_disk_free_bytes": "gauge",
    "gated_disk_low": "gauge",
    "gated_rule_hits_total": "counter",
    "gated_override_hits_total": "counter",
    "gated_override_entries": "gauge",
    "gated_override_expired_total": "counter",
    "gated_audit_records_total": "counter",
    "gated_audit_dropped_total": "counter",
    "gated_served_alignment": "gauge",
    "gated_served_alignment_window_signals": "gauge",
    "gated_served_outcomes_total": "counter",
    "gated_served_unlinked_total": "counter",
    "gated_connections": "gauge",
    "gated_buffered_bytes": "gauge",
    "gated_connections_dropped_total": "counter",
    "gated_requests_forbidden_total": "counter",
}

#: Trust (gated/daemon/trust.py): bounded label values.
RULE_ACTIONS = ("allow", "deny")
OVERRIDE_EXPIRY = ("ttl", "agreed", "evicted")
SERVED_SOURCES = ("rule", "override", "model")
SERVED_BANDS = ("allow", "ask", "block")
SERVED_RESULTS = ("agree", "disagree")


#: The per-tool series of a group with no signals (the "other" group before any).
_NO_TOOL_STATS = {"signals": 0, "alignment": 0.0, "ece": 0.0,
                  "confusion": {cell: 0 for cell in CONFUSION_CELLS}}


class Metrics:
    """All of the daemon's series, on a private registry.

    The attributes are plain prometheus_client metrics (use them directly where that is
    simplest); the methods bundle the updates each part of the daemon makes, so the
    trainer and server call one method per event.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 process_collector: bool = True) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        if process_collector:  # process_cpu_seconds_total, process_resident_memory_bytes...
            ProcessCollector(registry=r)

        self.loss = Gauge("gated_loss", "Total training loss of the last step "
                          "(lambda_bce*bce + lambda_ce*ce, plus the EWC penalty when on)",
                          registry=r)
        self.loss_bce = Gauge("gated_loss_bce", "Weighted gate BCE of the last step",
                              registry=r)
        self.loss_ce = Gauge("gated_loss_ce", "Decoder cross-entropy per reason token of "
                             "the last step", registry=r)
        self.alignment = Gauge("gated_alignment", "Fraction of the signals in the alignment "
                               "window where the serving model, scoring before training, "
                               "agreed with the label (progressive validation)", registry=r)
        self.alignment_window = Gauge("gated_alignment_window_signals", "Scored signals "
                                      "currently in the alignment window (full at "
                                      "train.alignment_window)", registry=r)
        self.converged = Gauge("gated_converged", "1 when the alignment window is full and "
                               "alignment >= train.converged_threshold, else 0", registry=r)
        self.confusion = Gauge("gated_confusion", "Confusion counts over the alignment "
                               "window; positive = block (tp: predicted block, label block)",
                               ["cell"], registry=r)
        self.alignment_corrected = Gauge(
            "gated_alignment_corrected", "Alignment of the same predictions against the "
            "labels as corrected later (a false_positive/false_negative relabels the "
            "prediction of that call): how often the model was RIGHT, not how often it "
            "agreed with the gate", registry=r)
        self.calibration_ece = Gauge("gated_calibration_ece", "Expected calibration error "
                                     "(10 bins) of the served, calibrated p_allow over the "
                                     "alignment window", registry=r)
        self.calibration_brier = Gauge("gated_calibration_brier", "Brier score of the "
                                       "served p_allow over the alignment window",
                                       registry=r)
        self.calibration_platt = Gauge("gated_calibration_platt", "Platt scaling in use: "
                                       "p_allow = sigmoid(a z + d z_deep + b); the "
                                       "transformer's share of the logit is (a + d) / a",
                                       ["param"], registry=r)
        self.calibration_platt.labels(param="a").set(1.0)  # identity until fitted
        self.calibration_platt.labels(param="b").set(0.0)
        self.calibration_platt.labels(param="d").set(0.0)
        self.drift_detections = Counter("gated_drift_detections", "Policy changes detected "
                                        "(Page-Hinkley on the progressive error stream)",
                                        registry=r)
        self.drift_withdrawn = Counter("gated_drift_withdrawn", "Drift alarms withdrawn: on "
                                       "the labels as corrected within "
                                       "train.drift_confirm_signals signals the error rate "
                                       "did not rise (a burst of the gate's own mistakes); "
                                       "the replay was kept", registry=r)
        self.drift_adapting = Gauge("gated_drift_adapting", "1 while the trainer adapts to "
                                    "a detected drift (EWC off, replay reduced)", registry=r)
        self.allow_band_open = Gauge("gated_allow_band_open", "1 when serving may answer "
                                     "`allow`; 0 until progressive validation has scored "
                                     "train.allow_band_after signals and for "
                                     "train.allow_band_drift_hold after an alarm of the "
                                     "drift detector or the allow band's guard (would-be "
                                     "allows are answered `ask`)", registry=r)
        self.wide_familiar = Gauge("gated_wide_familiar", "1 when serving reads the wide "
                                   "path's byte n-grams scaled by their familiarity "
                                   "(model.wide_familiarity > 0); 0 while the trainer's wide "
                                   "path adapts to a drift alarm "
                                   "(train.drift_wide_unscaled_examples) or without the "
                                   "scaling", registry=r)
        self.replay_dropped = Counter("gated_replay_dropped", "Replay examples dropped "
                                      "because a detected drift made their labels stale",
                                      registry=r)
        self.backpropagated = Counter("gated_signals_backpropagated", "Fresh signals that "
                                      "got a gradient (selective backprop: corrections, "
                                      "mistakes, unsure calls and a sample of the rest)",
                                      registry=r)
        self.scored_reused = Gauge("gated_scored_reused_share", "Share of the fresh signals "
                                   "the trainer process scored with the transformer logit "
                                   "serving had answered their call with (not computed "
                                   "again: [serving] served_logits)", registry=r)
        self.train_steps = Counter("gated_train_steps", "Optimiser steps taken (rolled-back "
                                   "steps are not counted)", registry=r)
        self.learning_rate = Gauge("gated_learning_rate", "Learning rate of the last step "
                                   "(after warmup/cosine schedule)", registry=r)
        self.grad_norm = Gauge("gated_grad_norm", "Global L2 norm of the last step's "
                               "gradient, before clipping", registry=r)
        self.signals_received = Counter("gated_signals_received", "Signals received and "
                                        "acknowledged (durably committed), duplicates "
                                        "included", registry=r)
        self.signals_rejected = Counter("gated_signals_rejected", "Signals or requests "
                                        "refused, by error code", ["reason"], registry=r)
        self.signals_scored = Counter("gated_signals_scored", "Signals scored by the serving "
                                      "model before training (progressive validation)",
                                      registry=r)
        self.queue_depth = Gauge("gated_queue_depth", "Signals acknowledged but not trained "
                                 "on yet", registry=r)
        self.weights_version = Gauge("gated_weights_version", "Version of the weights "
                                     "serving predictions", registry=r)
        self.swaps = Counter("gated_swaps", "Trained weights published to serving",
                             registry=r)
        self.rollbacks = Counter("gated_rollbacks", "Steps rolled back because the loss or "
                                 "the weights were NaN/Inf", registry=r)
        self.checkpoint_ts = Gauge("gated_checkpoint_timestamp_seconds", "Unix time of the "
                                   "last committed checkpoint (0: none yet)", registry=r)
        self.step_seconds = Histogram("gated_step_duration_seconds", "Wall time of one "
                                      "training step (batch build, forward, backward, "
                                      "AdamW)", buckets=LATENCY_BUCKETS, registry=r)
        self.predict_seconds = Histogram("gated_predict_duration_seconds", "Wall time to "
                                         "answer predict / explain, from request decoded to "
                                         "reply ready", ["op"], buckets=LATENCY_BUCKETS,
                                         registry=r)
        self.backend = Info("gated_backend", "Compute backend in use, the device, and why it "
                            "was chosen", registry=r)
        self.gpu_fallbacks = Counter("gated_gpu_fallbacks", "Times the daemon fell back from "
                                     "the GPU to the CPU: at start-up (GPU preflight failed, "
                                     "device = auto) or after repeated GPU failures while "
                                     "training", registry=r)
        self.device_memory = Gauge("gated_device_memory_bytes", "GPU memory at start-up, by "
                                   "kind: total, free, the estimate of what this config "
                                   "needs, and what a dry step of it reserved (all 0 on the "
                                   "CPU)", ["kind"], registry=r)
        self.config_reloads = Counter("gated_config_reloads", "Config reloads (file change "
                                      "or SIGHUP), by result", ["result"], registry=r)
        self.build = Info("gated_build", "gated version", registry=r)
        self.trainer_restarts = Counter("gated_trainer_restarts", "Times the trainer "
                                        "process died unasked and was restarted (serving "
                                        "kept the last published weights meanwhile)",
                                        registry=r)
        self.trainer_up = Gauge("gated_trainer_up", "1 while the trainer process runs",
                                registry=r)
        self.cache_lookups = Counter("gated_predict_cache_lookups", "Prediction cache "
                                     "lookups, by result (hit rate = hit / all)",
                                     ["result"], registry=r)
        self.cache_entries = Gauge("gated_predict_cache_entries", "Predictions cached for "
                                   "the serving weights version", registry=r)
        self.predict_batch = Histogram("gated_predict_batch_size", "Predictions answered "
                                       "by one forward pass (micro-batching)",
                                       buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        for result in ("hit", "miss"):
            self.cache_lookups.labels(result=result)
        self.promotions = Counter("gated_promotions", "Candidates judged by the promotion "
                                  "gate, by result (published / refused)", ["result"],
                                  registry=r)
        self.promotion_alignment = Gauge("gated_promotion_holdout_alignment", "Alignment "
                                         "on the held-back signals at the last judgement, "
                                         "of the candidate and of the serving model",
                                         ["model"], registry=r)
        self.tool_alignment = Gauge("gated_tool_alignment", "Progressive alignment per "
                                    "tool (the call's first word; top tools by volume, the "
                                    "rest as \"other\")", ["tool"], registry=r)
        self.tool_signals = Gauge("gated_tool_signals", "Signals in each tool's window",
                                  ["tool"], registry=r)
        self.tool_confusion = Gauge("gated_tool_confusion", "Confusion counts per tool over "
                                    "its window (block is positive)", ["tool", "cell"],
                                    registry=r)
        self.tool_ece = Gauge("gated_tool_calibration_ece", "Expected calibration error per "
                              "tool over its window", ["tool"], registry=r)
        self._tools: set[str] = set()
        self.set_per_tool({})  # "other" at zero until the trainer reports
        self.operator_rollbacks = Counter("gated_operator_rollbacks", "Operator rollbacks "
                                          "(gated rollback --to), by result (done / "
                                          "refused)", ["result"], registry=r)
        for result in ("done", "refused"):
            self.operator_rollbacks.labels(result=result)
        for result in ("published", "refused"):
            self.promotions.labels(result=result)
        for model in ("candidate", "serving"):
            self.promotion_alignment.labels(model=model)
        self.disk_free = Gauge("gated_disk_free_bytes", "Bytes free (for an unprivileged "
                               "writer) on the filesystem holding the state dir, checked "
                               "every 2 s", registry=r)
        self.connections = Gauge("gated_connections", "Client connections open",
                                 registry=r)
        self.buffered_bytes = Gauge("gated_buffered_bytes", "Bytes received from clients "
                                    "and not yet answered, all connections together (at "
                                    "most limits.max_buffered_bytes)", registry=r)
        self.connections_dropped = Counter("gated_connections_dropped", "Connections the "
                                           "daemon closed to stay within its bounds, by "
                                           "reason", ["reason"], registry=r)
        self.forbidden = Counter("gated_requests_forbidden", "Requests refused by the "
                                 "[access] lists (SO_PEERCRED), by op", ["op"], registry=r)
        for reason in DROP_REASONS:
            self.connections_dropped.labels(reason=reason)
        for op in GUARDED_OPS:
            self.forbidden.labels(op=op)
        self.disk_low = Gauge("gated_disk_low", "1 while the state dir's filesystem has less "
                              "than daemon.disk_free_warn_mib free", registry=r)
        self._init_trust(r)

        for cell in CONFUSION_CELLS:
            self.confusion.labels(cell=cell).set(0)
        for reason in REJECT_REASONS:
            self.signals_rejected.labels(reason=reason)
        for op in PREDICT_OPS:
            self.predict_seconds.labels(op=op)
        for result in RELOAD_RESULTS:
            self.config_reloads.labels(result=result)
        for kind in DEVICE_MEMORY_KINDS:
            self.device_memory.labels(kind=kind).set(0)
        self.backend.info({"backend": "unknown", "device": "unknown", "reason": "starting"})
        self.build.info({"version": __version__})

    def _init_trust(self, r: CollectorRegistry) -> None:
        """Operator rules, the override memory, the audit log, served alignment."""
        self.rule_hits = Counter("gated_rule_hits", "Predictions answered by an operator "
                                 "rule ([rules]), by action", ["action"], registry=r)
        self.override_hits = Counter("gated_override_hits", "Predictions answered by the "
                                     "override memory (a person's correction of that exact "
                                     "call)", registry=r)
        self.override_entries = Gauge("gated_override_entries", "Corrections in the "
                                      "override memory", registry=r)
        self.override_expiries = Counter("gated_override_expired", "Overrides removed, by "
                                         "reason: ttl, agreed (the model agrees by the "
                                         "margin), evicted (memory full)", ["reason"],
                                         registry=r)
        self.audit_records = Counter("gated_audit_records", "Audit records of served "
                                     "predictions written", registry=r)
        self.audit_dropped = Counter("gated_audit_dropped", "Audit records dropped (queue "
                                     "full, or the write failed: full disk); predictions "
                                     "are not affected", registry=r)
        self.served_alignment = Gauge("gated_served_alignment", "Fraction of the last "
                                      "audit.alignment_window signals referencing a "
                                      "prediction_id whose label the served answer "
                                      "(p_allow >= 0.5) agreed with", registry=r)
        self.served_window = Gauge("gated_served_alignment_window_signals", "Linked "
                                   "signals in the served-alignment window", registry=r)
        self.served_outcomes = Counter("gated_served_outcomes", "Signals linked to a served "
                                       "prediction, by the prediction's source and band and "
                                       "whether it agreed with the signal's label",
                                       ["source", "band", "result"], registry=r)
        self.served_unlinked = Counter("gated_served_unlinked", "Signals whose prediction_id "
                                       "is not in the audit log (unknown, pruned or "
                                       "dropped)", registry=r)
        for action in RULE_ACTIONS:
            self.rule_hits.labels(action=action)
        for reason in OVERRIDE_EXPIRY:
            self.override_expiries.labels(reason=reason)
        for source in SERVED_SOURCES:
            for band in SERVED_BANDS:
                for result in SERVED_RESULTS:
                    self.served_outcomes.labels(source=source, band=band, result=result)

    def override_expired(self, reason: str, n: int = 1) -> None:
        self.override_expiries.labels(
            reason=reason if reason in OVERRIDE_EXPIRY else "evicted").inc(n)

    def served_outcome(self, source: str, band: str, agree: bool, alignment: float,
                       window: int) -> None:
        self.served_outcomes.labels(
            source=source if source in SERVED_SOURCES else "model",
            band=band if band in SERVED_BANDS else "ask",
            result="agree" if agree else "disagree").inc()
        self.served_alignment.set(alignment)
        self.served_window.set(window)

    # --- trainer ------------------------------------------------------------------------
    def observe_step(self, info: Mapping[str, float], seconds: float) -> None:
        """One finished (not rolled-back) step; ``info`` as the engine's train_step returns
        it: loss, bce, ce, grad_norm, lr (missing keys are left unchanged)."""
        for key, gauge in (("loss", self.loss), ("bce", self.loss_bce),
                           ("ce", self.loss_ce), ("grad_norm", self.grad_norm),
                           ("lr", self.learning_rate)):
            if key in info and info[key] is not None:
                gauge.set(float(info[key]))
        self.train_steps.inc()
        self.step_seconds.observe(seconds)

    def set_alignment(self, alignment: float, window_signals: int,
                      confusion: Mapping[str, int], converged: bool,
                      scored: int = 0) -> None:
        """The alignment window after scoring ``scored`` more signals."""
        self.alignment.set(alignment)
        self.alignment_window.set(window_signals)
        for cell in CONFUSION_CELLS:
            self.confusion.labels(cell=cell).set(confusion.get(cell, 0))
        self.converged.set(1 if converged else 0)
        if scored:
            self.signals_scored.inc(scored)

    def set_learning(self, stats: Mapping[str, float], backpropagated: int = 0) -> None:
        """Progressive-validation statistics of the trainer's Monitor."""
        self.alignment_corrected.set(stats.get("alignment_corrected", 0.0))
        self.calibration_ece.set(stats.get("ece", 0.0))
        self.calibration_brier.set(stats.get("brier", 0.0))
        self.calibration_platt.labels(param="a").set(stats.get("calibration_a", 1.0))
        self.calibration_platt.labels(param="b").set(stats.get("calibration_b", 0.0))
        self.calibration_platt.labels(param="d").set(stats.get("calibration_d", 0.0))
        self.drift_adapting.set(stats.get("adapting", 0.0))
        self.allow_band_open.set(stats.get("allow_band_open", 1.0))
        if backpropagated:
            self.backpropagated.inc(backpropagated)

    def drifted(self) -> None:
        """A drift alarm (its verdict, and any replay it drops, come later)."""
        self.drift_detections.inc()

    def drift_verdict(self, confirmed: bool, dropped: int) -> None:
        """A drift alarm decided after the corrections it waited for."""
        if not confirmed:
            self.drift_withdrawn.inc()
        elif dropped:
            self.replay_dropped.inc(dropped)

    def swapped(self, version: int) -> None:
        self.swaps.inc()
        self.weights_version.set(version)

    def promotion(self, decision: Mapping[str, Any]) -> None:
        """A promotion-gate judgement (trainer/promotion.py). Unjudged passes (too few
        held-back signals) are not counted."""
        if decision["candidate"] != decision["candidate"]:  # NaN: not judged
            return
        self.promotions.labels(result="published" if decision["published"]
                               else "refused").inc()
        self.promotion_alignment.labels(model="candidate").set(decision["candidate"])
        self.promotion_alignment.labels(model="serving").set(decision["serving"])

    def set_per_tool(self, stats: Mapping[str, Mapping[str, Any]]) -> None:
        """The per-tool view (online/per_tool.py); tools that left the top are removed,
        so the label set stays bounded."""
        for gone in self._tools - set(stats) - {"other"}:
            for g in (self.tool_alignment, self.tool_signals, self.tool_ece):
                g.remove(gone)
            for cell in CONFUSION_CELLS:
                self.tool_confusion.remove(gone, cell)
        if "other" not in stats:  # always present (pre-created at zero), so never removed
            stats = {**stats, "other": _NO_TOOL_STATS}
        for tool, s in stats.items():
            self.tool_alignment.labels(tool=tool).set(s["alignment"])
            self.tool_signals.labels(tool=tool).set(s["signals"])
            self.tool_ece.labels(tool=tool).set(s["ece"])
            for cell in CONFUSION_CELLS:
                self.tool_confusion.labels(tool=tool, cell=cell).set(s["confusion"][cell])
        self._tools = set(stats)

    def rolled_back(self) -> None:
        self.rollbacks.inc()

    def checkpointed(self, ts: float) -> None:
        self.checkpoint_ts.set(ts)

    # --- server -------------------------------------------------------------------------
    def received(self, n: int = 1) -> None:
        if n:
            self.signals_received.inc(n)

    def rejected(self, code: str, n: int = 1) -> None:
        """A refused signal or request; unknown codes count as ``other`` (bounded labels)."""
        self.signals_rejected.labels(reason=code if code in REJECT_REASONS else "other").inc(n)

    def dropped(self, reason: str) -> None:
        self.connections_dropped.labels(reason=reason if reason in DROP_REASONS
                                        else DROP_REASONS[0]).inc()

    def refused(self, op: str) -> None:
        if op in GUARDED_OPS:
            self.forbidden.labels(op=op).inc()

    def observe_predict(self, seconds: float, op: str = "predict") -> None:
        self.predict_seconds.labels(op=op if op in PREDICT_OPS else "predict").observe(seconds)

    # --- daemon -------------------------------------------------------------------------
    def set_backend(self, backend: str, device: str, reason: str) -> None:
        """E.g. ("cupy", "cuda:0 NVIDIA H100", "device=auto, CUDA available") or
        ("numpy", "cpu", "device=auto: CuPy not installed")."""
        self.backend.info({"backend": backend, "device": device, "reason": reason})

    def gpu_fallback(self) -> None:
        self.gpu_fallbacks.inc()

    def set_device_memory(self, total: int, free: int, estimate: int,
                          reserved: int = 0) -> None:
        """The GPU preflight's numbers, in bytes (reserved: what a dry step of the largest
        batch really took, 0 when it did not run)."""
        for kind, n in (("total", total), ("free", free), ("estimate", estimate),
                        ("reserved", reserved)):
            self.device_memory.labels(kind=kind).set(n)

    def config_reload(self, ok: bool) -> None:
        self.config_reloads.labels(result="ok" if ok else "failed").inc()

    def serve(self, addr: str) -> MetricsServer:
        """Start the HTTP endpoint for this registry on ``addr`` ("HOST:PORT")."""
        return start_http_server(addr, self.registry)
