"""Metrics: every documented series, scraped over real HTTP and parsed by prometheus_client."""

from __future__ import annotations

import math
import re
import urllib.request
from pathlib import Path

import pytest
from daemon_proc import metric_samples, metric_value

from gated.config import parse_hostport
from gated.daemon.metrics import (
    CONFUSION_CELLS,
    REJECT_REASONS,
    SERIES,
    Metrics,
    start_http_server,
)
from gated.protocol import ERROR_CODES

ROOT = Path(__file__).resolve().parents[1]


def scrape(url: str) -> dict[str, list]:
    """sample name -> list of (labels, value) from a real HTTP GET."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return metric_samples(text)


@pytest.fixture
def served():
    m = Metrics()
    srv = m.serve("127.0.0.1:0")
    try:
        yield m, srv
    finally:
        srv.stop()


def test_every_documented_series_is_scraped(served):
    m, srv = served
    assert srv.port > 0 and srv.url == f"http://127.0.0.1:{srv.port}/metrics"
    got = scrape(srv.url)
    missing = [name for name, kind in SERIES.items()
               if (f"{name}_bucket" if kind == "histogram" else name) not in got]
    assert not missing, f"not in the scrape: {missing}"
    # histograms come with buckets, in seconds
    assert "gated_step_duration_seconds_bucket" in got
    les = {float(lab["le"]) for lab, _ in got["gated_predict_duration_seconds_bucket"]}
    assert min(les) <= 5e-5 and 10.0 in les
    # bounded labels, pre-created at zero
    assert {lab["cell"] for lab, _ in got["gated_confusion"]} == set(CONFUSION_CELLS)
    assert {lab["reason"] for lab, _ in got["gated_signals_rejected_total"]} == \
        set(REJECT_REASONS)
    assert {lab["result"] for lab, _ in got["gated_config_reloads_total"]} == {"ok", "failed"}
    assert {lab["kind"] for lab, _ in got["gated_device_memory_bytes"]} == \
        {"total", "free", "estimate", "reserved"}
    assert metric_value(got, "gated_backend_info", reason="starting") == 1.0
    assert all(name.startswith("gated_") for name in SERIES)
    assert "process_resident_memory_bytes" in got


def test_updates_show_in_the_scrape(served):
    m, srv = served
    m.observe_step({"loss": 0.7, "bce": 0.5, "ce": 0.4, "grad_norm": 3.5, "lr": 1e-3}, 0.02)
    m.observe_step({"loss": 0.6, "bce": 0.4, "ce": 0.4, "grad_norm": 2.5, "lr": 1e-3}, 0.03)
    m.set_alignment(0.96, 1000, {"tp": 300, "fp": 10, "tn": 660, "fn": 30}, True, scored=5)
    m.set_learning({"alignment_corrected": 0.97, "ece": 0.031, "brier": 0.04,
                    "calibration_a": 0.8, "calibration_b": -0.3, "adapting": 1.0},
                   backpropagated=3)
    m.drifted()  # an alarm that waits for corrections: ...
    m.drift_verdict(confirmed=True, dropped=120)  # ... confirmed, its replay dropped
    m.drifted()
    m.drift_verdict(confirmed=True, dropped=30)
    m.drifted()
    m.drift_verdict(confirmed=False, dropped=0)  # a bad spell of the gate: withdrawn
    m.received(10)
    m.rejected("wrong_type")
    m.rejected("some_new_code", 2)
    m.observe_predict(0.0004)
    m.observe_predict(0.05, op="explain")
    m.queue_depth.set(17)
    m.swapped(4)
    m.rolled_back()
    m.checkpointed(1_700_000_000.5)
    m.set_backend("numpy", "cpu", "device=auto: CuPy is not installed")
    m.gpu_fallback()
    m.set_device_memory(80 << 30, 70 << 30, 1 << 30, 3 << 29)
    m.config_reload(True)
    m.config_reload(False)
    got = scrape(srv.url)
    assert metric_value(got, "gated_loss") == 0.6
    assert metric_value(got, "gated_loss_bce") == 0.4
    assert metric_value(got, "gated_loss_ce") == 0.4
    assert metric_value(got, "gated_grad_norm") == 2.5
    assert metric_value(got, "gated_learning_rate") == 1e-3
    assert metric_value(got, "gated_train_steps_total") == 2
    assert metric_value(got, "gated_step_duration_seconds_count") == 2
    assert math.isclose(metric_value(got, "gated_step_duration_seconds_sum"), 0.05)
    assert metric_value(got, "gated_alignment") == 0.96
    assert metric_value(got, "gated_alignment_window_signals") == 1000
    assert metric_value(got, "gated_converged") == 1
    assert metric_value(got, "gated_confusion", cell="fn") == 30
    assert metric_value(got, "gated_signals_scored_total") == 5
    assert metric_value(got, "gated_alignment_corrected") == 0.97
    assert metric_value(got, "gated_calibration_ece") == 0.031
    assert metric_value(got, "gated_calibration_brier") == 0.04
    assert metric_value(got, "gated_calibration_platt", param="b") == -0.3
    assert metric_value(got, "gated_drift_detections_total") == 3
    assert metric_value(got, "gated_drift_withdrawn_total") == 1
    assert metric_value(got, "gated_drift_adapting") == 1
    assert metric_value(got, "gated_replay_dropped_total") == 150
    assert metric_value(got, "gated_signals_backpropagated_total") == 3
    assert metric_value(got, "gated_signals_received_total") == 10
    assert metric_value(got, "gated_signals_rejected_total", reason="wrong_type") == 1
    assert metric_value(got, "gated_signals_rejected_total", reason="other") == 2
    assert metric_value(got, "gated_predict_duration_seconds_count", op="predict") == 1
    assert metric_value(got, "gated_predict_duration_seconds_count", op="explain") == 1
    assert metric_value(got, "gated_predict_duration_seconds_bucket", op="predict",
                        le="0.0005") == 1
    assert metric_value(got, "gated_queue_depth") == 17
    assert metric_value(got, "gated_weights_version") == 4
    assert metric_value(got, "gated_swaps_total") == 1
    assert metric_value(got, "gated_rollbacks_total") == 1
    assert metric_value(got, "gated_checkpoint_timestamp_seconds") == 1_700_000_000.5
    assert metric_value(got, "gated_backend_info", backend="numpy", device="cpu") == 1
    assert metric_value(got, "gated_gpu_fallbacks_total") == 1
    assert metric_value(got, "gated_device_memory_bytes", kind="total") == 80 << 30
    assert metric_value(got, "gated_device_memory_bytes", kind="free") == 70 << 30
    assert metric_value(got, "gated_device_memory_bytes", kind="estimate") == 1 << 30
    assert metric_value(got, "gated_device_memory_bytes", kind="reserved") == 3 << 29
    assert metric_value(got, "gated_config_reloads_total", result="ok") == 1
    assert metric_value(got, "gated_config_reloads_total", result="failed") == 1


def test_many_registries_coexist():
    a, b = Metrics(process_collector=False), Metrics(process_collector=False)
    a.received(3)
    assert a.registry.get_sample_value("gated_signals_received_total") == 3
    assert b.registry.get_sample_value("gated_signals_received_total") == 0


def test_stop_frees_the_port():
    m = Metrics(process_collector=False)
    srv = m.serve("127.0.0.1:0")
    port = srv.port
    srv.stop()
    srv2 = start_http_server(f"127.0.0.1:{port}", m.registry)  # the same port again
    try:
        assert "gated_loss" in scrape(srv2.url)
    finally:
        srv2.stop()


def test_bind_failure_names_the_address():
    m = Metrics(process_collector=False)
    srv = m.serve("127.0.0.1:0")
    try:
        with pytest.raises(OSError, match="metrics_addr"):
            m.serve(f"127.0.0.1:{srv.port}")
    finally:
        srv.stop()


def test_reject_reasons_cover_every_protocol_error():
    assert set(ERROR_CODES) < set(REJECT_REASONS)


@pytest.mark.parametrize("addr, want", [
    ("127.0.0.1:9464", ("127.0.0.1", 9464)),
    ("[::1]:9464", ("::1", 9464)),
    ("localhost:0", ("localhost", 0)),
])
def test_parse_hostport(addr, want):
    assert parse_hostport(addr) == want


@pytest.mark.parametrize("addr", ["9464", ":9464", "::1:9464", "host:port", "h:70000", ""])
def test_parse_hostport_rejects(addr):
    with pytest.raises(ValueError):
        parse_hostport(addr)


def test_operations_doc_lists_every_series():
    doc = (ROOT / "docs" / "operations.md").read_text()
    documented = set(re.findall(r"`(gated_[a-z_]+)`", doc))
    missing = [name for name in SERIES if name not in documented]
    assert not missing, f"docs/operations.md does not document {missing}"
