"""Predict latency through the real daemon while it trains (DESIGN.md section 6).

Starts `gated run` (flint preset by default, CPU) on a temporary state directory, feeds
it a synthetic gateway stream at `--rate` signals/s from one client so the trainer is
busy and swaps happen, and measures `predict` round trips (64-byte context) from another
client: p50 / p90 / p99 / max, plus the same with the daemon idle, side by side.

    .venv/bin/python bench/bench_predict.py --seconds 60
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from gated.client import Client
from gated.demo import start_daemon, wait_for_socket
from gated.synthetic import SyntheticGateway

CONTEXT = "bash cat src/app/models.py | grep -n 'class ' | head -20 # check"  # 64 bytes
assert len(CONTEXT.encode()) == 64


def measure(sock: Path, seconds: float) -> np.ndarray:
    lat = []
    with Client(str(sock)) as c:
        for _ in range(20):  # warm-up
            c.predict(CONTEXT)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            c.predict(CONTEXT)
            lat.append(time.perf_counter() - t0)
            time.sleep(0.01)
    return np.array(lat) * 1e3


def feed(sock: Path, rate: float, stop: threading.Event, sent: list[int]) -> None:
    gen = SyntheticGateway(seed=1)
    with Client(str(sock)) as c:
        t0 = time.monotonic()
        while not stop.is_set():
            due = int((time.monotonic() - t0) * rate) + 1
            if due > sent[0]:
                c.signals([gen.signal() for _ in range(due - sent[0])])
                sent[0] = due
            time.sleep(0.01)


def row(name: str, ms: np.ndarray) -> str:
    p = np.percentile(ms, [50, 90, 99])
    return (f"| {name} | {len(ms)} | {p[0]:.2f} | {p[1]:.2f} | {p[2]:.2f} | {ms.max():.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="flint")
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--write", action="store_true", help="append the table to docs/benchmarks.md")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gated-bench-"))
    sock = tmp / "gated.sock"
    proc = start_daemon(tmp / "state", sock, a.preset, log_path=tmp / "daemon.log")
    try:
        wait_for_socket(sock, proc)
        idle = measure(sock, a.seconds / 3)
        stop, sent = threading.Event(), [0]
        feeder = threading.Thread(target=feed, args=(sock, a.rate, stop, sent), daemon=True)
        feeder.start()
        time.sleep(2.0)
        with Client(str(sock)) as c:
            v0 = c.status()["version"]
        busy = measure(sock, a.seconds)
        with Client(str(sock)) as c:
            st = c.status()
        stop.set()
        feeder.join()
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    lines = [
        f"Machine: {platform.processor() or platform.machine()}, "
        f"{len(__import__('os').sched_getaffinity(0))} cores, Python {platform.python_version()}"
        f", numpy {np.__version__}; preset {a.preset}, 64-byte context, one client, "
        f"10 ms between requests.",
        "",
        "| daemon | requests | p50 ms | p90 ms | p99 ms | max ms |",
        "| --- | --- | --- | --- | --- | --- |",
        row("idle", idle),
        row(f"training ({a.rate:g} signals/s in)", busy),
        "",
        f"While busy: {st['step']} steps, weights version {v0} -> {st['version']} "
        f"({st['version'] - v0} swaps during the measurement), {sent[0]} signals sent, "
        f"queue depth at the end {st['queue_depth']}.",
    ]
    print("\n".join(lines))
    if a.write:
        from docs_section import write_section

        cmd = (f"`.venv/bin/python bench/bench_predict.py --preset {a.preset} "
               f"--seconds {a.seconds:g} --write`")
        head = "## Predict latency (CPU)"
        write_section(head, f"{head}\n\nCommand: {cmd}\n\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
