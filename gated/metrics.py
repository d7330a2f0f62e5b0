"""Prometheus series of the daemon (DESIGN section 5; meanings in docs/operations.md).

Every series is prefixed ``gated_`` and in base units (seconds, ratios in 0..1, unix
seconds for timestamps). Labels are bounded: each labelled series lists its label values
up front (and pre-creates them at 0, so ``rate()`` works from the first scrape and a
dashboard shows a zero instead of "no data"); anything else maps to ``other``.

:class:`Metrics` owns its own ``CollectorRegistry`` rather than the process-global one,
so tests (and a process embedding two daemons) can build as many as they like.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client import start_http_server as _prom_start_http_server
from prometheus_client.process_collector import ProcessCollector

from . import __version__
from .protocol import ERROR_CODES

log = logging.getLogger("gated.metrics")

#: Latency buckets in seconds: 50 us (a cached tiny-model predict) .. 10 s (a flint
#: training step on a slow CPU).
LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
                   0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

CONFUSION_CELLS = ("tp", "fp", "tn", "fn")
REJECT_REASONS = (*ERROR_CODES, "other")
PREDICT_OPS = ("predict", "explain")
RELOAD_RESULTS = ("ok", "failed")
DEVICE_MEMORY_KINDS = ("total", "free", "estimate", "reserved")

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
    "gated_drift_adapting": "gauge",
    "gated_replay_dropped_total": "counter",
    "gated_signals_backpropagated_total": "counter",
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
}


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
                                       "p_allow = sigmoid(a z + b)", ["param"], registry=r)
        self.calibration_platt.labels(param="a").set(1.0)  # identity until fitted
        self.calibration_platt.labels(param="b").set(0.0)
        self.drift_detections = Counter("gated_drift_detections", "Policy changes detected "
                                        "(Page-Hinkley on the progressive error stream)",
                                        registry=r)
        self.drift_adapting = Gauge("gated_drift_adapting", "1 while the trainer adapts to "
                                    "a detected drift (EWC off, replay reduced)", registry=r)
        self.replay_dropped = Counter("gated_replay_dropped", "Replay examples dropped "
                                      "because a detected drift made their labels stale",
                                      registry=r)
        self.backpropagated = Counter("gated_signals_backpropagated", "Fresh signals that "
                                      "got a gradient (selective backprop: corrections, "
                                      "mistakes, unsure calls and a sample of the rest)",
                                      registry=r)
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
        self.drift_adapting.set(stats.get("adapting", 0.0))
        if backpropagated:
            self.backpropagated.inc(backpropagated)

    def drifted(self, dropped: int) -> None:
        self.drift_detections.inc()
        if dropped:
            self.replay_dropped.inc(dropped)

    def swapped(self, version: int) -> None:
        self.swaps.inc()
        self.weights_version.set(version)

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


def parse_hostport(addr: str) -> tuple[str, int]:
    """"127.0.0.1:9464" -> ("127.0.0.1", 9464); "[::1]:9464" -> ("::1", 9464).

    Port 0 asks the kernel for a free port (tests). Raises ValueError with what is wrong.
    """
    if not isinstance(addr, str) or ":" not in addr:
        raise ValueError(f"{addr!r} is not HOST:PORT (e.g. 127.0.0.1:9464 or [::1]:9464)")
    host, _, port_s = addr.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{addr!r}: write an IPv6 host in brackets, e.g. [::1]:9464")
    if not host:
        raise ValueError(f"{addr!r} has no host (use 0.0.0.0 to listen on every IPv4 "
                         "address)")
    if not port_s.isdigit() or not 0 <= int(port_s) <= 65535:
        raise ValueError(f"{addr!r}: port must be a number in 0..65535")
    return host, int(port_s)


@dataclass
class MetricsServer:
    """A running HTTP endpoint; ``stop()`` shuts it down and frees the port."""

    server: object
    thread: threading.Thread
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_http_server(addr: str, registry: CollectorRegistry) -> MetricsServer:
    """Serve ``registry`` on http://HOST:PORT/metrics from a daemon thread.

    Raises OSError when the address cannot be bound (say which, so the operator can change
    ``daemon.metrics_addr``).
    """
    host, port = parse_hostport(addr)
    try:
        server, thread = _prom_start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise OSError(e.errno, f"cannot serve metrics on {addr}: {e.strerror}; set "
                               "daemon.metrics_addr (or --metrics-addr) to a free "
                               "HOST:PORT") from e
    bound = server.server_address[1]
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return MetricsServer(server=server, thread=thread, host=host, port=bound)
