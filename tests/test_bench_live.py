"""bench/bench_live.py end to end on a small stream: a real `gated run` (tiny, CPU), the
realistic stream in real time over the real socket, and the report's figures consistent
with what was sent (the numbers themselves are the benchmark's, not asserted here)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_short_live_stream_is_scored_and_fully_taken_in(tmp_path):
    signals = 700
    out = subprocess.run(
        [sys.executable, "bench/bench_live.py", "--preset", "tiny", "--signals", str(signals),
         "--switch-at", "450", "--rate", "100", "--probes", "20", "--drain-wait", "60"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path)}).stdout
    rows = [line.split(" | ") for line in out.splitlines()
            if re.match(r"\| \d+ \| \d+ \| v\d", line)]
    assert [r[0] for r in rows] == ["| 500"], out  # one checkpoint of 500 ordinary signals
    # ... which the stream reached with its corrections too: the position the change (at
    # 450 signals of the stream) is counted against
    assert 500 < int(rows[0][1]) <= signals, out
    assert rows[0][2] == "v2"  # the change came at 450 signals, before the 500th scored
    # the probes were asked through the daemon and filled in (not the placeholder nan)
    assert "nan" not in rows[0][8] and "nan" not in rows[0][10], out
    # where a probe set missed 0.90, its wrong answers by TRUE category, adding up to it
    miss = re.search(r"its wrong answers by TRUE category: (.*)", out).group(1)
    unseen, recall, history = (float(rows[0][k].split(" / ")[0]) for k in (8, 9, 10))
    assert (miss == "nowhere") == (min(unseen, recall, history) >= 0.90), out
    for name, acc in (("unseen", unseen), ("history", history)):
        part = re.search(rf"500 {name}: ([^;]*)", miss)
        if part is not None:
            wrong = sum(int(w) for w in re.findall(r"(\d+) of \d+", part.group(1)))
            assert wrong == round((1.0 - acc) * 20), out  # --probes 20 in each set
    # every ordinary signal was asked and answered, every signal acknowledged ...
    asked = int(re.search(r"round trip, (\d+) calls\)", out).group(1))
    acked = int(re.search(r"round trip, (\d+) signals\)", out).group(1))
    assert acked == signals and 500 <= asked < signals
    # ... and the daemon's trainer took in the last of them after the stream
    assert re.search(r"at the stream's end, 0 \d+ s later", out), out
    assert re.search(r"SIGTERM: exit 0 after", out), out
    # the drift alarms as the daemon's status counted them, each inside the stream
    alarms = re.search(r"drift alarms, .*?: (none|[\d,]+(?:, [\d,]+)*) \(the change at 450\); "
                       r"withdrawn (\d+)", out)
    assert alarms is not None, out
    at = [] if alarms.group(1) == "none" else [int(x.replace(",", ""))
                                               for x in alarms.group(1).split(", ")]
    assert all(0 < a <= signals for a in at) and int(alarms.group(2)) <= len(at), out
    assert re.search(r"CPU seconds over the stream: trainer \d+", out)
    # the machine line carries the speed probe, measured, at 1 thread and at every core
    probe = re.search(r"speed probe: float32 256x256 @ 256x1024 (\d+) GFLOP/s at 1 thread"
                      r"(?:, (\d+) GFLOP/s at \d+ threads)?; a Python dict loop ([\d.]+) M", out)
    assert probe is not None and int(probe.group(1)) > 0 and float(probe.group(3)) > 0, out


def test_the_speed_probe_times_each_thread_count_in_its_own_interpreter():
    """Each thread count is a fresh interpreter with BLAS told its threads before NumPy
    loads; a count that cannot run says so instead of a number."""
    sys.path.insert(0, str(ROOT / "bench"))
    from docs_section import speed_probe

    line = speed_probe((1, 2))
    got = re.fullmatch(r"speed probe: float32 256x256 @ 256x1024 (\d+) GFLOP/s at 1 thread, "
                       r"(\d+) GFLOP/s at 2 threads; a Python dict loop ([\d.]+) M iterations/s",
                       line)
    assert got is not None, line
    assert int(got.group(1)) > 0 and int(got.group(2)) > 0 and float(got.group(3)) > 0
    # an interpreter that fails (a BLAS thread count it refuses is not portable to
    # provoke; a missing executable is): the line says the counts are not comparable
    real = sys.executable
    try:
        sys.executable = str(ROOT / "no-such-python")
        assert speed_probe((1,)).startswith("speed probe failed (FileNotFoundError")
    finally:
        sys.executable = real


def test_a_whole_heading_as_section_is_refused_before_the_run():
    """`--section` is appended to the benchmark's own heading: a whole heading there once
    gave "## Live daemon (flint, CPU, Live daemon (...))" in benchmarks.md after a run of
    ten minutes. Each benchmark that writes such a section refuses it at once (exit 2,
    argparse's usage error), before it starts a daemon, trains or writes anything."""
    doc = ROOT / "docs" / "benchmarks.md"
    before = doc.stat().st_mtime_ns
    for script, section in (("bench_live.py", "Live daemon (flint, CPU, main abc, seed 1)"),
                            ("bench_learning.py", "## Learning (flint, CPU, seed 1)"),
                            ("bench_encoding.py", "Source encoding ablation (offline, x)")):
        run = subprocess.run([sys.executable, f"bench/{script}", "--write", "--section",
                              section], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert run.returncode == 2, (script, run.stdout, run.stderr)
        assert "--section is the end of the heading" in run.stderr, run.stderr
        assert "give only what follows" in run.stderr
    assert doc.stat().st_mtime_ns == before  # nothing written
    # a suffix is accepted: the same check says nothing about it
    sys.path.insert(0, str(ROOT / "bench"))
    from docs_section import section_suffix_error

    assert section_suffix_error("Live daemon", "main abc1234, seed 3") is None
    assert section_suffix_error("Live daemon", None) is None
