"""Predict latency and throughput through the real daemon, idle and while it trains
(DESIGN.md section 6, issue 12).

Starts `gated run` (flint by default, CPU) on a temporary state directory and measures
`predict` round trips with 64-byte contexts over the real Unix socket:

1. idle, one client, a new context each request (every request a forward pass);
2. idle, one client, one repeated context (the exact prediction cache);
3. idle, 8 concurrent clients, new contexts, no pause: predictions/s and latency
   (micro-batching shares forwards between them);
4. while the trainer process works through a backlog of `--backlog` signals (sent first,
   all acknowledged, swap every second): rows 1 and 3 again.

Then, for the micro-batching effect, a second daemon with `batch_max = 1` (no batching)
runs row 3 and row 4's 8-client row, side by side.

    .venv/bin/python bench/bench_predict.py --seconds 20 --backlog 20000 --write
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from gated.client import Client
from gated.demo import start_daemon, wait_for_socket
from gated.synthetic import SyntheticGateway

PREFIX = "bash cat src/app/models.py | grep -n 'class ' | head "  # + 11 digits = 64 bytes


def context(i: int) -> str:
    """A distinct 64-byte context per i (the cache never hits)."""
    c = f"{PREFIX}{i % 10**11:011d}"
    assert len(c.encode()) == 64
    return c


def one_client(sock: Path, seconds: float, repeat: bool, start: int) -> np.ndarray:
    lat = []
    with Client(str(sock)) as c:
        for i in range(10):  # warm-up
            c.predict(context(start - 1 - i))
        end, i = time.monotonic() + seconds, start
        while time.monotonic() < end:
            ctx = context(0 if repeat else i)
            i += 1
            t0 = time.perf_counter()
            c.predict(ctx)
            lat.append(time.perf_counter() - t0)
            time.sleep(0.005)
    return np.array(lat) * 1e3


def many_clients(sock: Path, seconds: float, n: int, start: int) -> tuple[np.ndarray, float]:
    """`n` closed-loop clients, new contexts: (latencies ms, predictions/s)."""
    lats: list[list[float]] = [[] for _ in range(n)]
    barrier = threading.Barrier(n)

    def run(k: int) -> None:
        with Client(str(sock)) as c:
            c.predict(context(start - 1 - k))
            barrier.wait()
            end, i = time.monotonic() + seconds, start + k * 10_000_000
            while time.monotonic() < end:
                t0 = time.perf_counter()
                c.predict(context(i))
                lats[k].append(time.perf_counter() - t0)
                i += 1

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ms = np.array([x for lt in lats for x in lt]) * 1e3
    return ms, len(ms) / seconds


def send_backlog(sock: Path, n: int) -> int:
    gen = SyntheticGateway(seed=1)
    acked = 0
    with Client(str(sock), timeout=120) as c:
        while acked < n:
            res = c.signals([gen.signal() for _ in range(min(500, n - acked))])
            acked += sum(1 for r in res if "seq" in r)
    return acked


def row(name: str, ms: np.ndarray, rate: float | None = None) -> str:
    p = np.percentile(ms, [50, 90, 99])
    per_s = f"{rate:.0f}" if rate is not None else ""
    return (f"| {name} | {len(ms)} | {p[0]:.2f} | {p[1]:.2f} | {p[2]:.2f} | {ms.max():.2f} "
            f"| {per_s} |")


def run_daemon(tmp: Path, name: str, preset: str, config: str):
    cfg = tmp / f"{name}.toml"
    cfg.write_text(config)
    sock = tmp / f"{name}.sock"
    proc = start_daemon(tmp / name, sock, preset, extra=["--config", str(cfg)],
                        log_path=tmp / f"{name}.log")
    wait_for_socket(sock, proc)
    return proc, sock


def wait_trainer(sock: Path, timeout: float = 120.0) -> dict:
    """Until the trainer process has reported (so start-up is not measured)."""
    deadline = time.monotonic() + timeout
    with Client(str(sock)) as c:
        while time.monotonic() < deadline:
            st = c.status()
            if st["trainer"]["alive"] and st["version"] >= 1:
                return st
            time.sleep(0.2)
    raise TimeoutError("the trainer process did not publish within the timeout")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="flint")
    ap.add_argument("--seconds", type=float, default=20.0, help="per measurement")
    ap.add_argument("--backlog", type=int, default=20000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--write", action="store_true", help="write the section of docs/benchmarks.md")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gated-bench-"))
    s = a.seconds
    rows: list[str] = []
    notes: list[str] = []
    for name, config in (("default", ""), ("nobatch", "[serving]\nbatch_max = 1\n")):
        proc, sock = run_daemon(tmp, name, a.preset, config)
        try:
            wait_trainer(sock)
            if name == "default":
                rows.append(row("idle, 1 client, new contexts", one_client(sock, s, False, 1)))
                rows.append(row("idle, 1 client, one repeated context (cache)",
                                one_client(sock, s / 2, True, 10**9)))
            ms, rate = many_clients(sock, s, a.clients, 2 * 10**9)
            label = "batching" if name == "default" else "no batching (batch_max 1)"
            rows.append(row(f"idle, {a.clients} clients, {label}", ms, rate))
            t0 = time.monotonic()
            acked = send_backlog(sock, a.backlog)
            t_ack = time.monotonic() - t0
            with Client(str(sock)) as c:
                st0 = c.status()
            if name == "default":
                rows.append(row(f"training a {acked}-signal backlog, 1 client, new contexts",
                                one_client(sock, s, False, 3 * 10**9)))
            ms, rate = many_clients(sock, s, a.clients, 4 * 10**9)
            rows.append(row(f"training, {a.clients} clients, {label}", ms, rate))
            with Client(str(sock)) as c:
                st1 = c.status()
            notes.append(
                f"- {name}: backlog of {acked} signals acknowledged in {t_ack:.1f} s before "
                f"the training rows; during them the trainer went from step {st0['step']} to "
                f"{st1['step']}, weights version {st0['version']} -> {st1['version']} "
                f"({st1['version'] - st0['version']} swaps), trained through signal "
                f"{st1['last_trained_seq']} (queue {st1['queue_depth']} at the end); cache "
                f"{st1['cache']['hits']} hits / {st1['cache']['misses']} misses.")
        finally:
            with Client(str(sock)) as c:
                queued = c.status()["queue_depth"]
            proc.terminate()
            t_stop = time.monotonic()
            code = proc.wait(timeout=60)
            notes.append(f"- {name}: SIGTERM with {queued} signals queued: exit {code} after "
                         f"{time.monotonic() - t_stop:.1f} s.")
    lines = [
        f"Machine: {platform.processor() or platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}, numpy "
        f"{np.__version__}; preset {a.preset}, CPU, 64-byte contexts; the trainer in its own "
        f"process (nice 10, BLAS threads: serving 1, trainer the rest); {s:g} s per row; one "
        "client pauses 5 ms between requests, the concurrent clients do not.",
        "",
        "| daemon | requests | p50 ms | p90 ms | p99 ms | max ms | predictions/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
        *notes,
    ]
    print("\n".join(lines), flush=True)
    if a.write:
        from docs_section import write_section

        cmd = (f"`.venv/bin/python bench/bench_predict.py --preset {a.preset} --seconds "
               f"{s:g} --backlog {a.backlog} --write`")
        head = "## Predict latency (CPU)"
        write_section(head, f"{head}\n\nCommand: {cmd}\n\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
