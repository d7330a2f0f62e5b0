"""End to end against a real `gated run` process, a real socket and a real HTTP scrape."""

from __future__ import annotations

import signal
import socket
import time

import msgpack
import pytest
from daemon_proc import (
    FAST,
    QUIET,
    expected_band,
    metric_samples,
    metric_value,
    start,
    wait_until,
)
from prometheus_client.parser import text_string_to_metric_families

from gated.daemon.metrics import SERIES
from gated.daemon.serving import Calibration
from gated.engine import Model, ModelConfig, source_batch
from gated.store import load_published
from gated.synthetic import SyntheticGateway

# Every series docs/operations.md documents (gated.daemon.metrics.SERIES is checked against it).
DOCUMENTED_SERIES = sorted(SERIES)


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "gated.toml"
    path.write_text(FAST)
    return path


def _signals(n: int, seed: int = 0) -> list[dict]:
    gen = SyntheticGateway(seed=seed)
    return [gen.signal() for _ in range(n)]


def test_end_to_end_signals_train_swap_predict_metrics(tmp_path, config):
    d = start(tmp_path, config=config)
    try:
        with d.client() as c:
            before = c.predict("bash rm -rf /", ["ls"])
            assert before["version"] == 0 and before["band"] == expected_band(before["p_allow"])
            results = c.signals(_signals(300))
            assert [r["seq"] for r in results] == list(range(1, 301))
            assert not any(r["duplicate"] for r in results)
            one = c.signal({"context": "read_file README.md", "decision": "allow",
                            "id": "abc"})
            assert one["seq"] == 301 and one["duplicate"] is False
            again = c.signal({"context": "read_file README.md", "decision": "allow",
                              "id": "abc"})
            assert again == {**again, "seq": 301, "duplicate": True}
            # the wide path takes and publishes every signal at once (queue 0, new
            # versions) while the transformer's first step may still run: wait for both
            st = wait_until(lambda: (s := c.status())["queue_depth"] == 0 and s["version"] >= 2
                            and s["step"] > 0 and s, what="training to catch up")
            assert st["step"] > 0 and st["scored"] == 301 and st["last_trained_seq"] == 301
            after = c.predict("bash rm -rf /", ["ls"])
            assert after["version"] >= 2 and after["p_allow"] != before["p_allow"]
            ex = c.explain("bash rm -rf /")
            assert isinstance(ex["reason"], str) and 0.0 <= ex["p_allow"] <= 1.0
        text = d.scrape()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        # The parser names counters without _total and info metrics without _info.
        names = set(families) | {f"{n}_total" for n in families} | {f"{n}_info" for n in families}
        missing = [s for s in DOCUMENTED_SERIES if s not in names]
        assert not missing, f"series missing from the scrape: {missing}"
        samples = {s.name: s.value for f in families.values() for s in f.samples}
        assert samples["gated_signals_received_total"] == 302
        assert samples["gated_train_steps_total"] >= st["step"]
        assert samples["gated_weights_version"] >= 2
    finally:
        assert d.stop() == 0


def test_bands_are_the_configured_thresholds_of_p_allow_and_reload(tmp_path):
    """Thresholds that leave one band possible force it, for predict and explain; a
    change of [bands] in the file applies to the next prediction (the key is hot)."""
    path = tmp_path / "gated.toml"
    forced = {"ask": (1.0, 0.0),     # allow needs p >= 1, block p <= 0
              "allow": (0.0, 0.0),   # every p >= 0
              "block": (1.0, 1.0)}   # every p <= 1 (p >= 1 would be checked first)
    # the allow band open from the start (no evidence wait: the next test is about that)
    train = "[train]\nallow_band_after = 0\n"
    path.write_text(train + "[bands]\nallow = 1.0\nblock = 0.0\n")
    d = start(tmp_path, config=path)
    try:
        with d.client() as c:
            for band, (allow, block) in forced.items():
                path.write_text(train + f"[bands]\nallow = {allow}\nblock = {block}\n")
                got = wait_until(lambda band=band: (r := c.predict("bash rm -rf /", ["ls"]))
                                 ["band"] == band and r, what=f"band {band!r}")
                assert 0.0 < got["p_allow"] < 1.0, got  # strictly inside: forced, not luck
                ex = c.explain("bash rm -rf /", ["ls"])
                assert ex["band"] == band, ex
    finally:
        assert d.stop() == 0


def test_a_reload_of_bands_allow_reaches_the_allow_band_guard(tmp_path):
    """The allow band's guard runs in the trainer process; a reload of `bands.allow` in the
    file moves it to the band serving now answers (status `learning.allow_guard_band`,
    which the trainer reports with the signals it scores)."""
    path = tmp_path / "gated.toml"
    path.write_text(QUIET + "[bands]\nallow = 0.9\nblock = 0.1\n")
    d = start(tmp_path, config=path)
    more = iter(_signals(200, seed=1))
    try:
        with d.client() as c:
            c.signals(_signals(5))
            st = wait_until(lambda: (s := c.status())["scored"] == 5 and s, what="5 scored")
            assert st["learning"]["allow_guard_band"] == 0.9
            path.write_text(QUIET + "[bands]\nallow = 0.75\nblock = 0.1\n")
            # one more signal per look, so the trainer reports after the reload landed
            wait_until(lambda: c.signals([next(more)]) is not None
                       and c.status()["learning"]["allow_guard_band"] == 0.75,
                       what="the trainer's guard to watch bands.allow 0.75", interval=0.5)
    finally:
        assert d.stop() == 0


def test_the_allow_band_opens_once_enough_signals_are_scored(tmp_path):
    """A fresh daemon answers `ask` where p_allow is in the allow band until progressive
    validation has scored train.allow_band_after signals, then `allow`; p_allow itself is
    untouched. bands.allow = 0 puts every p_allow in the allow band, so the band shows the
    evidence rule alone. status and Prometheus say the same; a restart keeps it open."""
    path = tmp_path / "gated.toml"
    path.write_text(QUIET + "allow_band_after = 40\n[bands]\nallow = 0.0\nblock = 0.0\n")
    d = start(tmp_path, config=path)
    call = ("bash rm -rf /", ["ls"])
    try:
        with d.client() as c:
            first = c.predict(*call)
            assert first["band"] == "ask" and 0.0 < first["p_allow"] < 1.0, first
            assert c.status()["allow_band_open"] is False
            assert metric_value(metric_samples(d.scrape()), "gated_allow_band_open") == 0
            # no drift alarm: the wide path's n-grams are read by their familiarity
            assert c.status()["wide_familiar"] is True
            assert metric_value(metric_samples(d.scrape()), "gated_wide_familiar") == 1
            c.signals(_signals(30))
            st = wait_until(lambda: (s := c.status())["scored"] == 30 and s["queue_depth"] == 0
                            and s["version"] >= 1 and s, what="30 signals scored")
            assert st["allow_band_open"] is False and c.predict(*call)["band"] == "ask"
            c.signals(_signals(20, seed=1))
            got = wait_until(lambda: (r := c.predict(*call))["band"] == "allow" and r,
                             what="the allow band to open after 40 scored")
            assert 0.0 < got["p_allow"] < 1.0 and c.status()["allow_band_open"] is True
            assert metric_value(metric_samples(d.scrape()), "gated_allow_band_open") == 1
    finally:
        assert d.stop() == 0
    d2 = start(tmp_path, config=path, state_dir=d.state_dir)
    try:
        with d2.client() as c:
            assert c.predict(*call)["band"] == "allow" and c.status()["allow_band_open"]
            assert metric_value(metric_samples(d2.scrape()), "gated_allow_band_open") == 1
    finally:
        assert d2.stop() == 0


def test_restart_resumes_step_version_weights_and_trains_nothing_twice(tmp_path):
    # No idle replay steps: with no new signals a restarted daemon must not move at all.
    config = tmp_path / "quiet.toml"
    config.write_text(FAST.replace("idle_steps_per_second = 5.0", "idle_steps_per_second = 0.0"))
    d = start(tmp_path, config=config)
    with d.client() as c:
        c.signals(_signals(120, seed=3))
        wait_until(lambda: c.status()["queue_depth"] == 0, what="queue drained")
    assert d.stop() == 0
    assert "stopped cleanly" in d.log()
    # What the stopped daemon left: the published weights, read by another process.
    version, flat, head = load_published(d.state_dir, with_head=True)
    model = Model.from_flat(ModelConfig.tiny(), flat)
    src = source_batch([("write_file /etc/passwd", None)], model.cfg)
    # served: the published weights through the calibration published with them
    cal = Calibration(*head["calibration"]) if head.get("calibration") else Calibration()
    expect = float(cal.of(model.predict_z(src), src, model)[0])
    d2 = start(tmp_path, config=config, state_dir=d.state_dir)
    try:
        with d2.client() as c:
            st = c.status()
            assert st["last_trained_seq"] == 120
            assert st["scored"] == 0  # nothing re-scored, nothing re-trained as fresh
            first = c.predict("write_file /etc/passwd")
            assert st["version"] == version >= 1 and first["version"] == version
            assert first["p_allow"] == pytest.approx(expect, abs=1e-6)  # the same weights
    finally:
        assert d2.stop() == 0
    # And a third start sees exactly what the second one checkpointed.
    d3 = start(tmp_path, config=config, state_dir=d.state_dir)
    try:
        with d3.client() as c:
            st3 = c.status()
            assert st3["step"] >= st["step"] and st3["version"] >= st["version"]
            assert st3["last_trained_seq"] == 120
    finally:
        assert d3.stop() == 0


def test_signal_errors_are_clear_and_stored_nothing(tmp_path, config):
    d = start(tmp_path, config=config)
    try:
        with d.client() as c:
            reply = c.request("signals", signals=[
                {"context": "ls", "decision": "allow"},
                {"context": "ls", "decision": "maybe"},
                {"decision": "block"},
                "not a map",
                {"context": "x" * (64 * 1024 + 1), "decision": "allow"},
            ])["results"]
            assert reply[0] == {"seq": 1, "duplicate": False}
            codes = [r["error"]["code"] for r in reply[1:]]
            assert codes == ["invalid_value", "missing_field", "not_a_map", "too_large"]
            assert all(r["error"]["message"] for r in reply[1:])
            assert c.status()["last_seq"] == 1
    finally:
        d.stop()


def _raw(sock_path, payload: bytes, read_timeout: float = 5.0) -> tuple[list, bool]:
    """Send bytes, return (replies, closed_by_daemon)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(read_timeout)
    s.connect(str(sock_path))
    try:
        s.sendall(payload)
    except (BrokenPipeError, ConnectionResetError):
        pass
    unpacker = msgpack.Unpacker(raw=False)
    replies, closed = [], False
    deadline = time.monotonic() + read_timeout
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            closed = True
            break
        if not chunk:
            closed = True
            break
        unpacker.feed(chunk)
        replies.extend(unpacker)
        if replies and not closed:
            s.settimeout(0.5)
    s.close()
    return replies, closed


BAD_INPUTS = {
    "random_bytes": bytes([0xC1]) + b"\x8f\x00garbage",
    "not_a_map": msgpack.packb([1, 2, 3]),
    "unknown_op": msgpack.packb({"op": "drop_tables", "rid": 7}),
    "wrong_type_op": msgpack.packb({"op": 5, "rid": 8}),
    "wrong_type_context": msgpack.packb({"op": "predict", "rid": 9, "context": 12}),
    "huge_array_header": b"\x81\xa2op\xdd\x7f\xff\xff\xff",
    "huge_map_header": b"\xdf\x7f\xff\xff\xff",
    "deep_nesting": b"\x91" * 5000 + b"\xc0",
    # A well-formed message larger than the 8 MiB limit: a 9 MiB context.
    "oversize_frame": msgpack.packb({"op": "predict", "rid": 1, "context": "x" * (9 << 20)}),
}


@pytest.mark.parametrize("kind", sorted(BAD_INPUTS))
def test_bad_input_gets_error_or_clean_close_and_others_unaffected(tmp_path, config, kind):
    d = start(tmp_path, config=config)
    try:
        with d.client() as bystander:
            bystander.ping()
            replies, closed = _raw(d.sock, BAD_INPUTS[kind])
            assert replies or closed, "neither an error reply nor a close"
            for r in replies:
                assert r["ok"] is False and r["error"]["code"] and r["error"]["message"]
            assert bystander.ping()["pong"] is True  # the other client is unaffected
            res = bystander.signal({"context": "ls", "decision": "allow"})
            assert res["seq"] >= 1
        assert d.proc.poll() is None
    finally:
        d.stop()


def test_truncated_frame_then_close(tmp_path, config):
    d = start(tmp_path, config=config)
    try:
        frame = msgpack.packb({"op": "signal", "rid": 1, "context": "ls", "decision": "allow"})
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(d.sock))
        s.sendall(frame[: len(frame) // 2])
        s.close()  # the daemon must drop the half message and store nothing
        with d.client() as c:
            assert c.ping()["pong"] and c.status()["last_seq"] == 0
    finally:
        d.stop()


def test_sigterm_exits_zero_and_stops_cleanly(tmp_path, config):
    d = start(tmp_path, config=config)
    with d.client() as c:
        c.signals(_signals(50))
    assert d.stop(signal.SIGTERM) == 0
    assert "stopped cleanly" in d.log()
