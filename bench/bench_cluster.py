"""Cluster benchmark (issue 15): signals/s through two edges to the trainer (batched and
single), snapshot propagation of the model's weights to both edges, and edge predict
latency during a propagation. Real nats-server (JetStream, file storage, temp dir), real
`gated run --role trainer|edge` processes, all on this one machine.

    .venv/bin/python bench/bench_cluster.py                 # full run, updates docs
    .venv/bin/python bench/bench_cluster.py --signals 4000 --single 500 --versions 3 --no-docs
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from cluster_proc import nats_server, start_role, version, wait_connected  # noqa: E402
from daemon_proc import wait_until  # noqa: E402

from gated.client import Client  # noqa: E402

SECTION = "## Cluster (CPU)"


def sig(i: int, prefix: str) -> dict:
    block = i % 3 == 0
    return {"id": f"{prefix}-{i}", "context": f"shell.exec rm -rf /tmp/d{i}" if block
            else f"fs.read /home/u/file{i}.txt", "decision": "block" if block else "allow"}


def status(d) -> dict:
    with d.client() as c:
        return c.status()


def run_clients(edges, n: int, batch: int, prefix: str) -> float:
    """n signals split over one client per edge; batch 1 = one `signal` request each.
    Returns the seconds until every signal was acknowledged."""
    per = n // len(edges)
    errors: list = []

    def client(k: int, d) -> None:
        try:
            with Client(str(d.sock), timeout=60) as c:
                base = k * per
                if batch == 1:
                    for i in range(base, base + per):
                        c.signal(sig(i, prefix))
                else:
                    for i in range(base, base + per, batch):
                        res = c.signals([sig(j, prefix) for j in
                                         range(i, min(i + batch, base + per))])
                        bad = [r for r in res if "seq" not in r]
                        if bad:
                            raise RuntimeError(bad[0])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=client, args=(k, d)) for k, d in enumerate(edges)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def throughput(tmp: Path, n: int, n_single: int, batch: int) -> dict:
    nats = nats_server(tmp)
    tr = start_role(tmp, nats, "trainer", "tr")
    e1 = start_role(tmp, nats, "edge", "e1")
    e2 = start_role(tmp, nats, "edge", "e2")
    try:
        wait_connected(tr, e1, e2)
        run_clients([e1, e2], 512, 256, "warm")
        wait_until(lambda: status(tr)["last_seq"] >= 512, 120, "warm-up consumed")
        t0 = time.perf_counter()
        acked_s = run_clients([e1, e2], n, batch, "b")
        wait_until(lambda: status(tr)["last_seq"] >= 512 + n, 600, "batched consumed",
                   interval=0.02)
        stored_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        single_s = run_clients([e1, e2], n_single, 1, "s")
        wait_until(lambda: status(tr)["last_seq"] >= 512 + n + n_single, 600,
                   "single consumed", interval=0.02)
        single_stored_s = time.perf_counter() - t0
        last = status(tr)["last_seq"]
        return {"n": n, "batch": batch, "acked_rate": n / acked_s,
                "stored_rate": n / stored_s, "n_single": n_single,
                "single_rate": n_single / single_s,
                "single_stored_rate": n_single / single_stored_s,
                "logged": last, "expected": 512 + n + n_single}
    finally:
        for d in (e1, e2, tr):
            d.stop()
        nats.stop()


TRAIN_EVERY_STEP = """
[train]
batch_size = 8
swap_every_steps = 1
swap_every_seconds = 0.5
checkpoint_every_steps = 50
idle_steps_per_second = 0.0
"""


def propagation(tmp: Path, preset: str, versions: int) -> dict:
    nats = nats_server(tmp)
    args = ["--preset", preset]
    tr = start_role(tmp, nats, "trainer", "ptr", train=TRAIN_EVERY_STEP, args=args)
    e1 = start_role(tmp, nats, "edge", "pe1", train=TRAIN_EVERY_STEP, args=args)
    e2 = start_role(tmp, nats, "edge", "pe2", train=TRAIN_EVERY_STEP, args=args)
    lat: list[tuple[float, float]] = []   # (start, seconds) of edge-1 predicts
    stop = threading.Event()

    def hammer() -> None:
        i = 0
        with Client(str(e1.sock), timeout=60) as c:
            while not stop.is_set():
                t = time.perf_counter()
                c.predict(f"fs.read /srv/data/{i}.csv")  # distinct: no cache hits
                lat.append((t, time.perf_counter() - t))
                i += 1

    try:
        wait_connected(tr, e1, e2)
        wait_until(lambda: status(tr)["cluster"]["cluster_version"] is not None, 120,
                   "the first publish")
        v0 = status(tr)["cluster"]["cluster_version"]
        wait_until(lambda: version(e1) == v0 and version(e2) == v0, 60, "edges on it")
        h = threading.Thread(target=hammer)
        h.start()
        rows, windows = [], []
        seen = v0
        for k in range(versions):
            with Client(str(e2.sock)) as c:
                c.signals([sig(k * 8 + j, "p") for j in range(8)])
            v = wait_until(lambda s=seen: (lambda x: x if x is not None and x > s else None)(
                status(tr)["cluster"]["cluster_version"]), 300, "a new version",
                interval=0.02)
            wait_until(lambda v=v: version(e1) >= v and version(e2) >= v, 60,
                       "both edges on it", interval=0.01)
            per_edge = []
            for d in (e1, e2):
                li = status(d)["cluster"]["last_install"]
                per_edge.append(li["propagation_s"])
                if d is e1:
                    windows.append((li["at"] - li["fetch_verify_s"], li["at"]))
            rows.append({"version": v, "e1": per_edge[0], "e2": per_edge[1]})
            seen = max(version(e1), version(e2))
        stop.set()
        h.join()
        size = status(e1)["params"] * 4
        # predicts that started during an install on edge 1 (wall clock of the edge)
        offset = time.time() - time.perf_counter()
        during = [s for t, s in lat if any(a <= t + offset <= b for a, b in windows)]
        allp = [s for _, s in lat]
        return {"preset": preset, "rows": rows, "bytes": size,
                "p50": float(np.percentile(allp, 50)) * 1e3,
                "p99": float(np.percentile(allp, 99)) * 1e3, "n": len(allp),
                "during_n": len(during),
                "during_p99": float(np.percentile(during, 99)) * 1e3 if during else None,
                "during_max": max(during) * 1e3 if during else None}
    finally:
        stop.set()
        for d in (e1, e2, tr):
            d.stop()
        nats.stop()


def render(cmd: str, tp: dict, pr: dict) -> str:
    worst = max(max(r["e1"], r["e2"]) for r in pr["rows"])
    mean = float(np.mean([max(r["e1"], r["e2"]) for r in pr["rows"]]))
    lines = [
        SECTION, "",
        f"`{cmd}` (bench/bench_cluster.py). One machine: {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}; a real "
        "nats-server (JetStream, file storage on the temp dir), one trainer and two edges as "
        "`gated run --role ...` processes and the benchmark's client threads all share "
        "these cores, so the figures are a floor for a fleet where each role has its own "
        "host.", "",
        "| measure | result | goal |", "| --- | --- | --- |",
        f"| batched (`signals`, {tp['batch']} per request, one client per edge), "
        f"{tp['n']:,} signals: acknowledged by the edges | {tp['acked_rate']:,.0f}/s | "
        f">= 20,000/s ({'met' if tp['acked_rate'] >= 20000 else 'not met'}) |",
        f"| ... and committed to the trainer's LMDB log | {tp['stored_rate']:,.0f}/s | |",
        f"| single (`signal`, one request at a time, one client per edge), "
        f"{tp['n_single']:,} signals: acknowledged | {tp['single_rate']:,.0f}/s | |",
        f"| ... and committed to the trainer's log | {tp['single_stored_rate']:,.0f}/s | |",
        f"| snapshot propagation, {pr['preset']} ({pr['bytes'] / 1e6:.1f} MB of weights), "
        f"publish to both edges serving, {len(pr['rows'])} versions | mean {mean:.2f} s, "
        f"worst {worst:.2f} s | <= 1 s ({'met' if worst <= 1.0 else 'not met'}) |",
        f"| edge predict ({pr['preset']}) during a propagation: p99 | "
        + (f"{pr['during_p99']:.1f} ms ({pr['during_n']} predicts; max "
           f"{pr['during_max']:.1f} ms)" if pr["during_p99"] is not None else "n/a")
        + " | |",
        f"| edge predict ({pr['preset']}) over the whole run: p50 / p99 | "
        f"{pr['p50']:.1f} / {pr['p99']:.1f} ms ({pr['n']} predicts) | |", "",
        f"Throughput ran with the tiny preset (the trainer process training on the same cores "
        f"would otherwise take them); the trainer's log held {tp['logged']:,} signals for "
        f"{tp['expected']:,} sent (each id once). Propagation per version (seconds, edge 1 / "
        f"edge 2, from the trainer's encode before its Object Store put to the edge serving "
        f"the verified, warmed-up snapshot): "
        + ", ".join(f"v{r['version']} {r['e1']:.2f}/{r['e2']:.2f}" for r in pr["rows"]) + ".",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--signals", type=int, default=40000)
    ap.add_argument("--single", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--preset", default="flint", choices=["tiny", "flint"])
    ap.add_argument("--versions", type=int, default=8)
    ap.add_argument("--no-docs", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gbc") as d:
        tmp = Path(d)
        (tmp / "tp").mkdir()
        (tmp / "pr").mkdir()
        tp = throughput(tmp / "tp", a.signals, a.single, a.batch)
        print(f"batched: {tp['acked_rate']:,.0f}/s acked, {tp['stored_rate']:,.0f}/s stored; "
              f"single: {tp['single_rate']:,.0f}/s acked, {tp['single_stored_rate']:,.0f}/s "
              f"stored; log {tp['logged']} of {tp['expected']}", flush=True)
        pr = propagation(tmp / "pr", a.preset, a.versions)
        for r in pr["rows"]:
            print(f"version {r['version']}: edge1 {r['e1']:.3f} s, edge2 {r['e2']:.3f} s")
        print(f"predict p50 {pr['p50']:.1f} ms p99 {pr['p99']:.1f} ms; during propagation "
              f"p99 {pr['during_p99']} ms over {pr['during_n']}")
    cmd = "python bench/bench_cluster.py " + " ".join(argv if argv is not None
                                                       else sys.argv[1:])
    text = render(cmd.strip(), tp, pr)
    print(text)
    if not a.no_docs:
        from docs_section import write_section
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
