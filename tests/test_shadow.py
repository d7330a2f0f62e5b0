"""Shadow evaluation: the gateway keeps deciding, gated only records its answers; the
outcomes linked through prediction_id are summed up by `gated report` over time, by band
and by tool -- checked against a real daemon and against hand-made records."""

from __future__ import annotations

import re
import subprocess
import sys
import time

from daemon_proc import FAST, start, wait_until

from gated.online.shadow import by_key, format_report, linked, over_time


def _rec(ts, p, band, outcome, tool="fs.read"):
    return {"ts": ts, "p_allow": p, "band": band, "outcome": outcome, "tool": tool}


def test_agreement_over_time_by_band_and_tool():
    recs = [_rec(10, 0.9, "allow", "allow"), _rec(20, 0.8, "ask", "block"),
            _rec(3610, 0.1, "block", "block", "shell.exec"),
            _rec(3620, 0.6, "ask", "allow", "shell.exec"),
            {"ts": 3630, "p_allow": 0.9, "band": "allow", "tool": "x"}]  # no outcome
    rs = linked(recs)
    assert len(rs) == 4
    rows = over_time(rs, 3600.0)
    assert [r["n"] for r in rows] == [2, 2]
    assert rows[0]["agreement"] == 0.5 and rows[1]["agreement"] == 1.0
    assert rows[0]["ask"] == (1, 0.0) and rows[1]["block"] == (1, 1.0)
    assert by_key(rs, "tool") == [("fs.read", 2, 0.5), ("shell.exec", 2, 1.0)]
    assert by_key(rs, "tool", top=1) == [("fs.read", 2, 0.5), ("other", 2, 1.0)]
    text = format_report(recs, 3600.0)
    assert "4 served predictions with the gateway's outcome, agreement 75.0%" in text


def test_shadow_mode_end_to_end(tmp_path):
    """The gateway asks, decides by itself, and reports with the prediction_id."""
    cfg = tmp_path / "gated.toml"
    cfg.write_text(FAST.replace("idle_steps_per_second = 5.0", "idle_steps_per_second = 0.0"))
    d = start(tmp_path, config=cfg)
    calls = [f"fs.read src/m{i}.py" for i in range(6)] + \
            [f"shell.exec rm -rf /srv/{i}" for i in range(6)]
    agree = 0
    try:
        with d.client() as c:
            for i, ctx in enumerate(calls):
                reply = c.predict(ctx)
                decision = "allow" if ctx.startswith("fs.read") else "block"
                agree += (reply["p_allow"] >= 0.5) == (decision == "allow")
                c.signal({"context": ctx, "decision": decision, "id": f"g{i}",
                          "prediction_id": reply["prediction_id"]})
            wait_until(lambda: c.status()["queue_depth"] == 0, what="signals trained")
            time.sleep(0.5)  # the audit writer batches every 0.1 s
    finally:
        assert d.stop() == 0
    out = subprocess.run([sys.executable, "-m", "gated", "report", "--state-dir",
                          str(d.state_dir), "--out", str(tmp_path / "r.png")],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    m = re.search(r"(\d+) served predictions with the gateway's outcome, agreement "
                  r"([\d.]+)%", out)
    assert m, out
    assert int(m.group(1)) == len(calls)
    assert abs(float(m.group(2)) - 100 * agree / len(calls)) < 0.05
    shadow = out[out.index("shadow evaluation:"):]
    table = shadow[re.search(r"^tool +linked +agree$", shadow, re.M).end():]
    tools = {line.split()[0]: line.split()[1] for line in table.strip().splitlines()}
    assert tools == {"fs.read": "6", "shell.exec": "6"}
