"""Start and stop a real `gated run` process for the end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gated.client import Client
from gated.config import BandsConfig
from gated.demo import free_port

#: A config that trains, swaps and checkpoints quickly (daemon tests).
FAST = """
[train]
lr = 0.003
batch_size = 16
swap_every_steps = 2
swap_every_seconds = 0.5
checkpoint_every_steps = 5
idle_steps_per_second = 5.0
"""

#: FAST without idle steps: versions change only when signals arrive, so a test can hold
#: the version still.
QUIET = FAST.replace("idle_steps_per_second = 5.0", "idle_steps_per_second = 0.0")


def expected_band(p_allow: float, bands: BandsConfig | None = None) -> str:
    """The band docs/protocol.md defines for ``p_allow`` under ``[bands]`` (default: the
    config's defaults), computed here independently of the daemon's code."""
    b = bands or BandsConfig()
    if p_allow >= b.allow:
        return "allow"
    return "block" if p_allow <= b.block else "ask"


@dataclass
class DaemonProc:
    proc: subprocess.Popen
    state_dir: Path
    sock: Path
    metrics_port: int
    log_path: Path

    def client(self, timeout: float = 30.0) -> Client:
        return Client(str(self.sock), timeout=timeout)

    def scrape(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"daemon did not stop within {timeout}s; log:\n{self.log()}") from None


def start(tmp: Path, *, config: Path | None = None, extra: list[str] | None = None,
          env: dict | None = None, pass_fds: tuple = (), sock: Path | None = None,
          wait: bool = True, state_dir: Path | None = None,
          launcher: list[str] | None = None) -> DaemonProc:
    """`launcher` replaces `python -m gated.cli` (e.g. a script that patches a stand-in in
    first, then calls gated.cli.main)."""
    state_dir = state_dir or tmp / "state"
    sock = sock or tmp / "gated.sock"
    port = free_port()
    log_path = tmp / f"daemon-{time.monotonic_ns()}.log"
    cmd = [*(launcher or [sys.executable, "-m", "gated.cli"]), "run",
           "--state-dir", str(state_dir), "--socket", str(sock),
           "--metrics-addr", f"127.0.0.1:{port}", "--preset", "tiny", "--device", "cpu"]
    if config:
        cmd += ["--config", str(config)]
    cmd += extra or []
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env,
                                pass_fds=pass_fds)
    d = DaemonProc(proc, state_dir, sock, port, log_path)
    if wait:
        wait_ready(d)
    return d


def wait_ready(d: DaemonProc, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if d.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {d.proc.returncode}; log:\n{d.log()}")
        try:
            with d.client(timeout=5) as c:
                c.ping()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"daemon not ready after {timeout}s; log:\n{d.log()}")


def wait_until(pred, timeout: float = 60.0, what: str = "condition", interval: float = 0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def metric_samples(text: str) -> dict[str, list]:
    """sample name -> list of (labels, value), parsed by prometheus_client from a scrape."""
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def metric_value(samples, name, **labels):
    """The value of the first sample of `name` whose labels include `labels`."""
    for lab, v in samples[name]:
        if all(lab.get(k) == want for k, want in labels.items()):
            return v
    raise KeyError(f"{name}{labels}")

