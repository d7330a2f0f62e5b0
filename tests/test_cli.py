"""The command line against a real daemon: send, predict, explain, status, report,
backup, inspect, and the demo."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from daemon_proc import expected_band, start, wait_until

from gated.synthetic import SyntheticGateway

CONFIG = """
[train]
lr = 0.003
swap_every_steps = 2
checkpoint_every_steps = 5
"""


def gated(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gated.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_cli_send_predict_explain_status_report_backup_inspect(tmp_path):
    cfg = tmp_path / "g.toml"
    cfg.write_text(CONFIG)
    d = start(tmp_path, config=cfg)
    sock = str(d.sock)
    try:
        gen = SyntheticGateway(seed=9)
        jsonl = tmp_path / "signals.jsonl"
        jsonl.write_text("\n".join(json.dumps(gen.signal()) for _ in range(150)) + "\n")
        r = gated("send", "--socket", sock, "--file", str(jsonl), "--batch", "64")
        assert r.returncode == 0, r.stderr
        assert "150/150 signals, 0 rejected" in r.stderr
        r = gated("send", "--socket", sock, "--context", "bash ls", "--decision", "allow",
                  "--id", "cli-1")
        assert r.returncode == 0 and json.loads(r.stdout) == {"rid": 1, "ok": True, "seq": 151,
                                                              "duplicate": False}
        r = gated("send", "--socket", sock, "--context", "bash ls", "--decision", "maybe")
        assert r.returncode == 2 and "invalid choice" in r.stderr
        with d.client() as c:
            # the wide path takes every signal at once (queue 0) while the transformer's
            # first step may still run: wait for both, not for the first alone
            wait_until(lambda: (s := c.status())["queue_depth"] == 0 and s["step"] >= 1,
                       what="training caught up and stepped")
        pred = json.loads(gated("predict", "--socket", sock, "bash rm -rf /").stdout)
        assert pred["band"] == expected_band(pred["p_allow"]) and pred["version"] >= 1
        exp = json.loads(gated("explain", "--socket", sock, "bash rm -rf /").stdout)
        assert isinstance(exp["reason"], str) and exp["band"] == expected_band(exp["p_allow"])
        st = json.loads(gated("status", "--socket", sock).stdout)
        assert st["last_seq"] == 151 and st["step"] >= 1
    finally:
        assert d.stop() == 0

    png = tmp_path / "report.png"
    r = gated("report", "--state-dir", str(d.state_dir), "--out", str(png))
    assert r.returncode == 0, r.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000

    backup = tmp_path / "backup"
    r = gated("backup", str(backup), "--state-dir", str(d.state_dir))
    assert r.returncode == 0, r.stderr
    info = json.loads(gated("inspect", str(backup), "--json").stdout)
    # the backup holds every signal, and the same state as the original
    assert info["signals"]["count"] == 151
    assert (info["signals"]["first_seq"], info["signals"]["last_seq"]) == (1, 151)
    live = json.loads(gated("inspect", str(d.state_dir), "--json").stdout)
    for part in ("signals", "escalation_fingerprints", "replay", "checkpoint", "published"):
        assert info[part] == live[part], part
    r = gated("inspect", str(d.state_dir))
    assert r.returncode == 0
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("signals "))
    assert "151 stored (seq 1..151), last seq 151" in line, r.stdout


@pytest.mark.slow
def test_demo_converges_on_the_cpu_within_its_bound(tmp_path):
    r = gated("demo", "--preset", "tiny", "--max-seconds", "240", "--state-dir",
              str(tmp_path / "demo"), timeout=400)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "converged: alignment" in r.stdout
