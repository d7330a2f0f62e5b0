"""bench/bench_learning.py cut short by SIGTERM still reports what ran.

A device call's `timeout` (bench/gpu_learning.sh) ends a run with SIGTERM. Before
2026-11-28 that killed the run between checkpoints with no summary: four GPU runs cut at
~6,500 of 8,000 signals left tables without their paired comparison, calibration or
keeping-up lines. Here a real benchmark process (the tiny preset, on the CPU) gets a real
SIGTERM once its stream has begun, and must end on its own with its last checkpoint and
summary for the signals it produced, fewer than it was asked for."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_sigterm_ends_the_stream_and_prints_the_summary_of_what_ran(tmp_path):
    trace = tmp_path / "trace.jsonl"
    asked = 100_000
    proc = subprocess.Popen(
        [sys.executable, "bench/bench_learning.py", "--preset", "tiny", "--signals", str(asked),
         "--switch-at", str(asked), "--probes", "20", "--trace", str(trace)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        # the stream has begun once the trace holds a scored signal
        while not (trace.exists() and trace.stat().st_size > 0):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the benchmark scored no signal in 120 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    cut = re.search(r"- cut short by SIGTERM after ([\d,]+) of ([\d,]+) signals", out)
    assert cut, out
    produced = int(cut.group(1).replace(",", ""))
    assert 0 < produced < asked
    assert int(cut.group(2).replace(",", "")) == asked
    # the last checkpoint covers what ran: its row, then the summary's lines
    rows = [line for line in out.splitlines() if re.match(r"\| \d", line)]
    assert rows, out
    assert "- paired with the anchor on the same signals" in out
    assert "- last 2000 scored, against the TRUE label: ECE" in out
    assert re.search(r"- keeping up: \d+ steps in [\d.]+ s of virtual time", out)
    # as the daemon: the gateway's predict came first, and the trainer reused what it served
    served = re.search(r"- the trainer scored ([\d,]+) fresh signals with the transformer logit "
                       r"served for their call and ran the transformer again for ([\d,]+)", out)
    assert served, out
    reused, computed = (int(g.replace(",", "")) for g in served.groups())
    assert reused > 0 and reused + computed >= produced
