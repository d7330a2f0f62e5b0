"""`gated demo`: a daemon on a temporary state directory, driven by a synthetic gateway.

It shows a newcomer the whole loop: signals in over the socket, the trainer learning,
weights swapped in, alignment rising. One live line; exit 0 once converged (alignment
>= 0.95 over the last 1000 scored signals), or a clear failure after the bound.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .client import Client
from .synthetic import SyntheticGateway


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daemon(state_dir: Path, sock: Path, preset: str, extra: list[str] | None = None,
                 log_path: Path | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "gated.cli", "run", "--state-dir", str(state_dir),
           "--socket", str(sock), "--metrics-addr", f"127.0.0.1:{free_port()}",
           "--preset", preset, "--device", "cpu", *(extra or [])]
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def wait_for_socket(sock: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon exited with code {proc.returncode} during start-up")
        if sock.exists():
            try:
                with Client(str(sock), timeout=5) as c:
                    c.ping()
                    return
            except OSError:
                pass
        time.sleep(0.1)
    raise TimeoutError(f"the daemon did not open {sock} within {timeout:.0f}s")


def run_demo(a: argparse.Namespace) -> int:
    tmp = Path(a.state_dir) if a.state_dir else Path(tempfile.mkdtemp(prefix="gated-demo-"))
    tmp.mkdir(parents=True, exist_ok=True)
    sock, log_path = tmp / "gated.sock", tmp / "daemon.log"
    proc = start_daemon(tmp / "state", sock, a.preset, log_path=log_path)
    gen = SyntheticGateway(seed=int.from_bytes(os.urandom(2), "little"))
    print(f"gated demo: daemon pid {proc.pid}, preset {a.preset}, state {tmp}, "
          f"log {log_path}", flush=True)
    try:
        wait_for_socket(sock, proc)
        with Client(str(sock)) as c:
            sent, t0, last_print = 0, time.monotonic(), 0.0
            while True:
                elapsed = time.monotonic() - t0
                due = min(int(elapsed * a.rate) + 1, a.max_signals)
                if due > sent:
                    c.signals([gen.signal() for _ in range(due - sent)])
                    sent = due
                if elapsed - last_print >= 1.0:
                    last_print = elapsed
                    st = c.status()
                    loss = st.get("loss", {}).get("loss")
                    print(f"\r{elapsed:6.0f}s  sent {sent:6d} ({sent / max(elapsed, 1e-9):5.0f}"
                          f"/s)  scored {st['scored']:6d}  step {st['step']:5d}  loss "
                          f"{loss if loss is None else round(loss, 4)!s:>7}  alignment "
                          f"{st['alignment']:.3f}  version {st['version']}", end="",
                          flush=True)
                    if st["converged"]:
                        print(f"\nconverged: alignment {st['alignment']:.3f} over the last "
                              f"{st['window']} signals after {sent} signals in {elapsed:.0f}s")
                        return 0
                    if sent >= a.max_signals and st["queue_depth"] == 0 or \
                            elapsed > a.max_seconds:
                        print(f"\nnot converged within the bound ({sent} signals, "
                              f"{elapsed:.0f}s): alignment {st['alignment']:.3f}. The daemon's "
                              f"log is {log_path}.", file=sys.stderr)
                        return 1
                time.sleep(0.05)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        if not a.state_dir:
            shutil.rmtree(tmp, ignore_errors=True)
