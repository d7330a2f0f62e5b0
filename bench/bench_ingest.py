"""Durable ingest benchmark: signals acknowledged per second through group commit.

Every number counts a signal only once its future resolved, i.e. after the LMDB write
transaction holding it committed (sync + metasync: fsync'd). Variants:

* ``1 client, batch B``: one caller submits B signals per request (the ``signals`` batch
  op) and waits for each acknowledgement before sending more.
* ``8 clients, batch B``: eight clients doing the same at once; their requests share
  commits. ``batch 1`` is DESIGN.md's "8 concurrent single-signal clients".
* ``8 clients, batch 1, window W``: each client keeps W single-signal requests in flight
  (a pipelining client on the socket) instead of waiting for each reply.

Clients are asyncio tasks on one event loop, as in the daemon's socket server.
Signals are realistic: a 100-300 byte tool call, up to 3 history items, a reason, a unique
id (so dedup is exercised) and ~3% false-positive/negative corrections (escalation).

    .venv/bin/python bench/bench_ingest.py            # prints the table, updates docs
    .venv/bin/python bench/bench_ingest.py --no-docs --seconds 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

import lmdb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gated.signals import validate_signal  # noqa: E402
from gated.store import GroupCommitter, Store  # noqa: E402
from gated.store.group import GATHER_SECONDS  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## Durable ingest"
#: DESIGN.md section 6 (raised 2026-11-23): acknowledged signals/s with the batch op, and
#: from 8 single-signal clients that each wait for their reply
BATCH_TARGET, SINGLE_TARGET = 100_000, 20_000
TOOLS = ["shell.exec", "fs.read", "fs.write", "http.get", "http.post", "db.query", "git.push"]


class SignalSource:
    """Unique signals (fresh ids) over a pool of realistic bodies; cheap and thread-safe."""

    def __init__(self, seed: int = 0, bodies: int = 4096) -> None:
        self._lock = threading.Lock()
        self._n = 0
        rng = random.Random(seed)
        self._bodies = [self._body(rng) for _ in range(bodies)]

    @staticmethod
    def _body(rng: random.Random) -> dict:
        tool = rng.choice(TOOLS)
        arg = "".join(rng.choice("abcdefghijklmnop/._-") for _ in range(rng.randint(80, 280)))
        sig = {"context": f"{tool}(arg='{arg}')",
               "history": [f"{rng.choice(TOOLS)}(...)" for _ in range(rng.randint(0, 3))],
               "decision": "block" if rng.random() < 0.3 else "allow",
               "reason": f"policy rule {rng.randint(1, 40)} matched"}
        roll = rng.random()
        if roll < 0.015:
            sig["feedback"], sig["decision"] = "false_positive", "block"
        elif roll < 0.03:
            sig["feedback"], sig["decision"] = "false_negative", "allow"
        return sig

    def take(self, n: int) -> list[dict]:
        with self._lock:
            start, self._n = self._n, self._n + n
        bodies, now = self._bodies, time.time()
        return [{**bodies[i % len(bodies)], "id": f"bench-{i}", "ts": now}
                for i in range(start, start + n)]


def fsync_latency_ms(path: str) -> float:
    """Median fdatasync of a 4 KiB write here: the floor of one durable commit."""
    f = os.path.join(path, "fsync-probe")
    fd = os.open(f, os.O_CREAT | os.O_WRONLY, 0o600)
    times = []
    try:
        for i in range(30):
            os.pwrite(fd, b"x" * 4096, i * 4096)
            t = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(f)
    return statistics.median(times) * 1e3


def run_case(workdir: str, clients: int, batch: int, window: int, seconds: float,
             source: SignalSource, gather: float = GATHER_SECONDS) -> dict:
    """Acknowledged signals/s for one configuration, on a fresh state dir.

    Clients are asyncio tasks on one event loop that validate their batch and await
    `submit_async()`, as the daemon's socket server does: one loop thread
    (validation happens there, once), the group-commit writer thread.
    """
    state = tempfile.mkdtemp(prefix="state-", dir=workdir)
    store = Store(state)
    committer = GroupCommitter(store, gather_seconds=gather)
    latencies: list[float] = []
    # Pre-generate so the clients measure the store, not the generator.
    pools = [source.take(max(batch * 32, 4096)) for _ in range(clients)]

    async def client(k: int, deadline: float) -> int:
        pool, pos, done = pools[k], 0, 0
        inflight: deque[tuple[float, asyncio.Future]] = deque()

        async def reap() -> None:
            nonlocal done
            t0, fut = inflight.popleft()
            await fut
            latencies.append(time.perf_counter() - t0)
            done += batch

        while time.perf_counter() < deadline:
            if pos + batch > len(pool):
                pool, pos = source.take(len(pool)), 0
            t0 = time.perf_counter()
            valid = [validate_signal(s) for s in pool[pos:pos + batch]]
            inflight.append((t0, committer.submit_async(valid)))
            pos += batch
            while len(inflight) >= window:
                await reap()
        while inflight:
            await reap()
        return done

    async def all_clients() -> tuple[int, float]:
        t0 = time.perf_counter()
        done = await asyncio.gather(*(client(k, t0 + seconds) for k in range(clients)))
        return sum(done), time.perf_counter() - t0

    total, elapsed = asyncio.run(all_clients())
    commits = committer.commits
    committer.close()
    assert store.count_signals() == total, "every acknowledged signal must be stored"
    store.close()
    shutil.rmtree(state, ignore_errors=True)
    latencies.sort()
    return {"clients": clients, "batch": batch, "window": window, "signals": total,
            "seconds": elapsed, "rate": total / elapsed, "commits": commits,
            "per_commit": total / max(commits, 1),
            "p50_ms": latencies[len(latencies) // 2] * 1e3,
            "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3}


def gather_ab(workdir: str, seconds: float, source: SignalSource, pairs: int = 3) -> dict:
    """8 waiting single-signal clients with the commit round's gather off and on
    (`GroupCommitter._gather`), alternated `pairs` times in this run, so that the
    machine's drift falls on both: medians and their ratio."""
    off, on, per_off, per_on = [], [], [], []
    for _ in range(pairs):
        for rates, per, gather in ((off, per_off, 0.0), (on, per_on, GATHER_SECONDS)):
            r = run_case(workdir, 8, 1, 1, seconds, source, gather)
            rates.append(r["rate"])
            per.append(r["per_commit"])
    m_off, m_on = statistics.median(off), statistics.median(on)
    return {"off": m_off, "on": m_on, "ratio": m_on / m_off, "pairs": pairs,
            "per_off": statistics.median(per_off), "per_on": statistics.median(per_on)}


def crash_campaign(rounds: int) -> dict:
    """DESIGN.md's "100 kill -9 crash cycles with zero acknowledged signals lost": run the
    crash tests with ``rounds`` SIGKILL rounds of signal appends (and half as many of
    checkpoints); every acknowledged signal and checkpoint is verified after each kill."""
    env = {**os.environ, "GATED_CRASH_ROUNDS": str(rounds)}
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/test_store_crash.py", "-k", "kill9"], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    tail = (r.stdout.strip().splitlines() or ["(no output)"])[-1]
    return {"rounds": rounds, "ok": r.returncode == 0, "summary": tail,
            "seconds": time.perf_counter() - t}


def machine_info(workdir: str) -> dict:
    from docs_section import cpu_name

    cpu = cpu_name(default="unknown")
    fs = "unknown"
    try:
        best = ""
        real = os.path.realpath(workdir)
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                if real.startswith(mnt) and len(mnt) > len(best):
                    best, fs = mnt, f"{fstype} on {dev}"
    except OSError:
        pass
    commit_ms, per_signal_us = commit_costs(workdir)
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "py_lmdb": lmdb.__version__, "lmdb": ".".join(map(str, lmdb.version())),
            "fs": fs, "fsync_ms": fsync_latency_ms(workdir), "commit_ms": commit_ms,
            "per_signal_us": per_signal_us}


def commit_costs(workdir: str) -> tuple[float, float]:
    """(ms per 1-signal append, us per signal in 1024-signal appends), direct calls."""
    state = tempfile.mkdtemp(prefix="costs-", dir=workdir)
    src = SignalSource(seed=1)
    try:
        with Store(state) as store:
            one = src.take(200)
            t = time.perf_counter()
            for s in one:
                store.append_signals([s])
            commit_ms = (time.perf_counter() - t) / len(one) * 1e3
            big = src.take(8 * 1024)
            t = time.perf_counter()
            for i in range(0, len(big), 1024):
                store.append_signals(big[i:i + 1024])
            per_signal_us = (time.perf_counter() - t) / len(big) * 1e6
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return commit_ms, per_signal_us


CASES = [  # (clients, batch, window)
    (1, 1, 1), (1, 64, 1), (1, 1024, 1),
    (8, 1, 1), (8, 64, 1), (8, 1024, 1),
    (8, 1, 32),
]


def render(results: list[dict], info: dict, command: str, crash: dict | None,
           ab: dict | None = None) -> str:
    lines = [
        SECTION,
        "",
        "Signals per second *acknowledged* through `gated.store.GroupCommitter`: a signal",
        "counts only after the LMDB transaction holding it committed with `sync=True,",
        "metasync=True` (fsync'd). Each case uses a fresh state dir. `batch` = signals per",
        "request (the `signals` op), `window` = requests a client keeps in flight.",
        "",
        f"Machine: {info['cpu']}, {info['cores']} cores; Python {info['python']}, py-lmdb "
        f"{info['py_lmdb']} (LMDB {info['lmdb']}); state on {info['fs']}; median "
        f"fdatasync {info['fsync_ms']:.2f} ms (an LMDB commit syncs twice: data, then meta);",
        f"a direct 1-signal `append_signals` takes {info['commit_ms']:.2f} ms, a 1024-signal one "
        f"{info['per_signal_us']:.1f} us per signal (validation included).",
        "",
        f"Command: `{command}`",
        "",
        "| clients | batch | window | signals/s | signals/commit | p50 ack ms | p99 ack ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(f"| {r['clients']} | {r['batch']} | {r['window']} | {r['rate']:,.0f} | "
                     f"{r['per_commit']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
    best_batch = max(r["rate"] for r in results if r["batch"] >= 1024)
    single8 = next(r for r in results if (r["clients"], r["batch"], r["window"]) == (8, 1, 1))
    piped = next((r for r in results if r["clients"] == 8 and r["batch"] == 1
                  and r["window"] > 1), None)
    # Each waiting client has one signal in flight, so a commit holds at most `clients`
    # of them and no two commits overlap (one LMDB writer): the ceiling of the row is
    # `clients` signals per commit of that many, whatever the server does around it.
    ceiling = single8["clients"] / ((info["commit_ms"] + (single8["clients"] - 1)
                                     * info["per_signal_us"] / 1e3) / 1e3)
    lines += [
        "",
        f"DESIGN.md target (section 6, raised 2026-11-23), batch op >= {BATCH_TARGET:,} "
        f"signals/s: **{best_batch:,.0f}/s** "
        f"({'met' if best_batch >= BATCH_TARGET else 'not met'}).",
        f"Target, 8 concurrent single-signal clients that wait for each reply >= "
        f"{SINGLE_TARGET:,}/s: **{single8['rate']:,.0f}/s** "
        f"({'met' if single8['rate'] >= SINGLE_TARGET else 'not met'}); the disk's ceiling "
        f"for it here is ~{ceiling:,.0f}/s (8 signals per commit of 8: "
        f"{info['commit_ms']:.2f} ms + 7 x {info['per_signal_us']:.1f} us, two fsyncs "
        f"each){'; out of reach on this disk' if ceiling < SINGLE_TARGET else ''}"
        + (f". With {piped['window']} requests in flight per client: "
           f"**{piped['rate']:,.0f}/s** "
           f"({'above' if piped['rate'] >= SINGLE_TARGET else 'below'} that rate)."
           if piped else "."),
        "",
    ]
    if ab:
        lines += [
            f"The commit round's gather (`GroupCommitter._gather`, {GATHER_SECONDS * 1e6:.0f} us "
            f"at most: a round waits for as many callers as the last one had), 8 waiting "
            f"single-signal clients, off and on alternated {ab['pairs']} times in this run: "
            f"median **{ab['off']:,.0f}/s** off ({ab['per_off']:.1f} signals per commit), "
            f"**{ab['on']:,.0f}/s** on ({ab['per_on']:.1f}): **{ab['ratio']:.2f}x**.",
            "",
        ]
    lines += [
        "Reading the numbers: a commit has a fixed cost (two fsyncs plus the page writes,",
        f"~{info['commit_ms']:.2f} ms for a small one here) however many signals it holds, and",
        f"each signal adds ~{info['per_signal_us']:.0f} us of Python (validation, msgpack, dedup",
        "and escalation lookups). Group commit shares the fixed cost between every request",
        "waiting, so throughput grows with signals in flight (batch x clients x window)",
        "until the per-signal work and the per-request hand-off (future, event-loop wake-up)",
        "saturate the interpreter. A single-signal client that waits for every reply is",
        "bound by that hand-off and the commit latency, not by the batch path; pipelining",
        "requests lifts it. On a disk with slow fsync (milliseconds, e.g. network storage)",
        "the large-batch rows barely move while the batch-1 rows fall in proportion. This",
        "is a shared 2-core VM: repeated runs varied by about +-20%.",
        "",
    ]
    if crash:
        lines += [
            f"Crash safety (target: 100 kill -9 cycles, zero acknowledged signals lost): "
            f"{crash['rounds']} SIGKILL rounds of group-committed appends plus "
            f"{max(25, crash['rounds'] // 2)} of checkpoint+publish, each followed by a "
            f"restart that checks every acknowledged signal, the log's continuity and the "
            f"checkpoint's single step: **{'passed' if crash['ok'] else 'FAILED'}** "
            f"({crash['summary']}; `GATED_CRASH_ROUNDS={crash['rounds']} .venv/bin/python -m "
            f"pytest tests/test_store_crash.py -k kill9`).",
            "",
        ]
    return "\n".join(lines)


def update_doc(section: str, doc: Path = DOC) -> None:
    """Replace this benchmark's section in docs/benchmarks.md (other sections untouched)."""
    from docs_section import write_section

    write_section(SECTION, section, doc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="duration of each case")
    ap.add_argument("--dir", default=None, help="where the state dirs go (default: a temp "
                    "dir on the default tmp filesystem; benchmark the disk you deploy on)")
    ap.add_argument("--no-docs", action="store_true", help="do not update docs/benchmarks.md")
    ap.add_argument("--crash-rounds", type=int, default=100,
                    help="SIGKILL rounds of the crash campaign (0: skip it)")
    a = ap.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="gated-bench-ingest-", dir=a.dir)
    try:
        info = machine_info(workdir)
        print(f"{info['cpu']}, {info['cores']} cores, Python {info['python']}, py-lmdb "
              f"{info['py_lmdb']} (LMDB {info['lmdb']}), {info['fs']}, fdatasync "
              f"{info['fsync_ms']:.2f} ms")
        source = SignalSource()
        results = []
        print(f"{'clients':>7} {'batch':>6} {'window':>6} {'signals/s':>11} {'per commit':>10} "
              f"{'p50 ms':>7} {'p99 ms':>7}")
        for clients, batch, window in CASES:
            r = run_case(workdir, clients, batch, window, a.seconds, source)
            results.append(r)
            print(f"{clients:>7} {batch:>6} {window:>6} {r['rate']:>11,.0f} "
                  f"{r['per_commit']:>10.1f} {r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f}",
                  flush=True)
        ab = gather_ab(workdir, a.seconds, source)
        print(f"8 waiting single-signal clients, gather off / on (median of {ab['pairs']}): "
              f"{ab['off']:,.0f} / {ab['on']:,.0f} signals/s ({ab['ratio']:.2f}x; "
              f"{ab['per_off']:.1f} / {ab['per_on']:.1f} per commit)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    crash = None
    if a.crash_rounds > 0:
        crash = crash_campaign(a.crash_rounds)
        print(f"crash campaign, {a.crash_rounds} kill -9 rounds: "
              f"{'passed' if crash['ok'] else 'FAILED'} ({crash['summary']})")
    command = ".venv/bin/python bench/bench_ingest.py" + (
        f" --seconds {a.seconds:g}" if a.seconds != 3.0 else "")
    section = render(results, info, command, crash, ab)
    if not a.no_docs:
        update_doc(section)
        print(f"updated {DOC.relative_to(ROOT)} ({SECTION})")
    return 0 if crash is None or crash["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
