"""`gated rollback --to VERSION` against a real daemon: a kept earlier version is
republished atomically as the next version and training goes on from it, or pauses until
`gated resume`; an unknown version is refused and nothing changes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from daemon_proc import QUIET, metric_samples, metric_value, start, wait_until

from gated.client import GatedError
from gated.store import Store
from gated.synthetic import SyntheticGateway


def _signals(n: int, seed: int) -> list[dict]:
    gen = SyntheticGateway(seed=seed)
    return [gen.signal() for _ in range(n)]


def _published(state: Path, version: int) -> np.ndarray:
    store = Store(state)
    try:
        return store.load_published_version(version)
    finally:
        store.close()


def test_rollback_republishes_a_kept_version_and_pause_stops_training(tmp_path):
    cfg = tmp_path / "gated.toml"
    cfg.write_text(QUIET)
    d = start(tmp_path, config=cfg)
    try:
        with d.client() as c:
            c.signals(_signals(120, 1))
            first = wait_until(lambda: (s := c.status())["queue_depth"] == 0
                               and s["version"] >= 2 and s, what="training")["version"]
            c.signals(_signals(120, 2))
            later = wait_until(lambda: (s := c.status())["queue_depth"] == 0
                               and s["version"] > first and s, what="more training")
            old = _published(d.state_dir, first)
            assert old is not None
            assert not np.array_equal(old, _published(d.state_dir, later["version"]))

            with pytest.raises(GatedError) as e:
                c.rollback(10_000)
            assert e.value.code == "invalid_value"
            assert c.status()["version"] == later["version"]

            out = subprocess.run([sys.executable, "-m", "gated", "rollback", "--socket",
                                  str(d.sock), "--to", str(first), "--pause"],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            st = c.status()
            assert st["version"] > later["version"] and st["paused"]
            np.testing.assert_array_equal(_published(d.state_dir, st["version"]), old)
            assert metric_value(metric_samples(d.scrape()), "gated_operator_rollbacks_total",
                                result="done") == 1

            # paused: new signals are acknowledged but not trained on
            trained = st["last_trained_seq"]
            c.signals(_signals(30, 3))
            time.sleep(1.5)  # several wake-ups and swap intervals of the FAST config
            st = c.status()
            assert st["last_trained_seq"] == trained and st["queue_depth"] == 30
            c.resume()
            wait_until(lambda: (s := c.status())["queue_depth"] == 0 and not s["paused"]
                       and s, what="training after resume")
    finally:
        assert d.stop() == 0
