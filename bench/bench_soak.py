"""Soak: mixed traffic for a long time, with reloads and kill -9, and nothing acked lost.

A real `gated run` (CPU) serves ``--writers`` signal clients (single signals, and every
tenth request a batch of 10, each with a unique id, at ``--rate`` signals/s in all) and
``--predictors`` predict clients (back to back, latency measured per request) for
``--minutes``. Every ``--sighup-every`` seconds the daemon gets SIGHUP (a config reload);
every ``--kill-every`` seconds it is killed with SIGKILL and started again on the same
state, while the clients keep going: a request cut by the kill has an unknown outcome,
so its writer re-sends the same id until it is acknowledged (as a gateway would; the
daemon stores an id once).

At the end the daemon is stopped with SIGTERM, the state is opened, and every
acknowledged signal must be in the log with the sequence number its acknowledgement
gave. Sampled every second: the RSS of the daemon (anonymous, and file-backed: LMDB's
map) and of its trainer process. Reported
per minute: signals acknowledged, predictions, predict latency (p50, p99, max), RSS,
events; a PNG draws RSS and latency over time (gated/report.py's charts).

    .venv/bin/python bench/bench_soak.py                                  # 30 minutes
    .venv/bin/python bench/bench_soak.py --minutes 3 --sighup-every 30 --kill-every 60 \\
        --label "short run"
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import msgpack
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from docs_section import machine  # noqa: E402

from gated.demo import free_port  # noqa: E402
from gated.report import render_panels  # noqa: E402
from gated.store import Store  # noqa: E402

SECTION = "## Soak (CPU)"
MiB = 1 << 20
CONFIG = """
[train]
swap_every_seconds = 1.0
checkpoint_every_steps = 20
idle_steps_per_second = 1.0
"""


def rss(pid: int | None) -> tuple[int, int]:
    """(anonymous, file-backed) resident bytes of ``pid``: the heap, and the pages of
    mapped files -- LMDB's data.mdb, read through its map, counts there and grows with
    the log, but the kernel can drop it at any time."""
    anon = file = 0
    if not pid:
        return anon, file
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    anon = int(line.split()[1]) * 1024
                elif line.startswith("RssFile:") or line.startswith("RssShmem:"):
                    file += int(line.split()[1]) * 1024
    except OSError:
        pass
    return anon, file


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


class Daemon:
    """The daemon process: start, SIGHUP, kill -9 and restart, SIGTERM."""

    def __init__(self, tmp: Path, preset: str, config: str = CONFIG,
                 device: str = "cpu") -> None:
        self.tmp, self.preset, self.device = tmp, preset, device
        self.sock = tmp / "gated.sock"
        self.state = tmp / "state"
        self.cfg = tmp / "gated.toml"
        self.cfg.write_text(config)
        self.log = tmp / "daemon.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> float:
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "gated.cli", "run", "--config", str(self.cfg),
               "--state-dir", str(self.state), "--socket", str(self.sock),
               "--metrics-addr", f"127.0.0.1:{free_port()}", "--preset", self.preset,
               "--device", self.device]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.starts += 1
        while time.monotonic() - t0 < 120:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited {self.proc.returncode} at start; "
                                   f"see {self.log}")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(5)
                    s.connect(str(self.sock))
                    s.sendall(msgpack.packb({"op": "ping", "rid": 0}))
                    if s.recv(4096):
                        return time.monotonic() - t0
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the daemon did not become ready")

    def trainer_pid(self) -> int | None:
        """The trainer process (spawned: `spawn_main`), not multiprocessing's resource
        tracker beside it."""
        for kid in children(self.proc.pid) if self.proc else []:
            try:
                with open(f"/proc/{kid}/cmdline", "rb") as f:
                    if b"spawn_main" in f.read():
                        return kid
            except OSError:
                pass
        return None

    def kill9(self) -> list[int]:
        """SIGKILL the daemon; returns its children (the trainer, multiprocessing's
        resource tracker), which must exit on their own."""
        kids = children(self.proc.pid)
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        return kids

    def stop(self) -> tuple[int, float]:
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=120), time.monotonic() - t0


class Conn:
    """One client connection that reconnects (the daemon may be down for a while)."""

    def __init__(self, path: Path, stop: threading.Event) -> None:
        self.path, self.stop = path, stop
        self.sock: socket.socket | None = None
        self.unpacker = msgpack.Unpacker(raw=False)
        self.rids = itertools.count(1)

    def call(self, req: dict) -> dict | None:
        """The reply, or None when the connection broke (outcome unknown)."""
        while self.sock is None:
            if self.stop.is_set():
                return None
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(30)
                s.connect(str(self.path))
                self.sock, self.unpacker = s, msgpack.Unpacker(raw=False)
            except OSError:
                time.sleep(0.05)
        rid = next(self.rids)
        try:
            self.sock.sendall(msgpack.packb({**req, "rid": rid}))
            while True:
                for reply in self.unpacker:
                    return reply
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionError
                self.unpacker.feed(data)
        except OSError:
            self.sock.close()
            self.sock = None
            return None


class Record:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: dict[str, int] = {}          # id -> seq from its acknowledgement
        self.acks: list[float] = []              # time of each acknowledged signal
        self.refused: defaultdict[str, int] = defaultdict(int)
        self.unknown = 0                         # requests cut by a kill (re-sent)
        self.predicts: list[tuple[float, float]] = []  # (time, seconds)
        self.predict_errors: defaultdict[str, int] = defaultdict(int)


def writer(k: int, d: Daemon, rec: Record, stop: threading.Event, rate: float,
           t0: float) -> None:
    conn = Conn(d.sock, stop)
    n = 0
    pending: list[dict] = []
    next_at = time.monotonic()
    while not stop.is_set():
        if not pending:
            size = 10 if n % 100 == 99 else 1
            pending = [{"id": f"w{k}-{n + i}", "context": f"fs.read /srv/app/{k}/{(n + i) % 977}",
                        "decision": "allow" if (n + i) % 3 else "block",
                        "reason": "soak"} for i in range(size)]
            n += size
        req = {"op": "signals", "signals": pending} if len(pending) > 1 else \
            {"op": "signal", **pending[0]}
        reply = conn.call(req)
        if reply is None:
            with rec.lock:
                rec.unknown += 1
            continue  # re-send the same ids
        now = time.monotonic() - t0
        if reply.get("ok"):
            results = reply["results"] if "results" in reply else [reply]
            with rec.lock:
                for sig, res in zip(pending, results, strict=True):
                    if "seq" in res:
                        rec.acked[sig["id"]] = res["seq"]
                        rec.acks.append(now)
                    else:
                        rec.refused[res["error"]["code"]] += 1
            pending = []
        else:
            with rec.lock:
                rec.refused[reply["error"]["code"]] += 1
            time.sleep(0.05)  # shutting_down / overloaded: back off, re-send the same ids
            continue
        next_at += len(results) / rate
        delay = next_at - time.monotonic()
        if delay > 0:
            stop.wait(delay)
        else:
            next_at = time.monotonic()


def predictor(k: int, d: Daemon, rec: Record, stop: threading.Event, t0: float) -> None:
    conn = Conn(d.sock, stop)
    for i in itertools.count():
        if stop.is_set():
            return
        t = time.perf_counter()
        reply = conn.call({"op": "predict", "context": f"shell.exec ls /tmp/{k}/{i % 5000}",
                           "history": ["fs.read /etc/hosts"]})
        dt = time.perf_counter() - t
        if reply is None:
            continue
        with rec.lock:
            if reply.get("ok"):
                rec.predicts.append((time.monotonic() - t0 - dt, dt))
            else:
                rec.predict_errors[reply["error"]["code"]] += 1
        stop.wait(0.005)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--sighup-every", type=float, default=60.0, help="seconds")
    ap.add_argument("--kill-every", type=float, default=300.0, help="seconds")
    ap.add_argument("--preset", default="tiny", choices=("tiny", "flint"))
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--rate", type=float, default=100.0, help="signals/s, all writers")
    ap.add_argument("--predictors", type=int, default=2)
    ap.add_argument("--png", default=str(ROOT / "docs" / "soak.png"))
    ap.add_argument("--label", default="")
    ap.add_argument("--no-docs", action="store_true")
    a = ap.parse_args(argv)
    command = "bench/bench_soak.py " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    tmp = Path(tempfile.mkdtemp(prefix="gated-soak-"))
    d = Daemon(tmp, a.preset)
    d.start()
    rec, stop = Record(), threading.Event()
    t0 = time.monotonic()
    threads = [threading.Thread(target=writer, args=(k, d, rec, stop, a.rate / a.writers, t0))
               for k in range(a.writers)]
    threads += [threading.Thread(target=predictor, args=(k, d, rec, stop, t0))
                for k in range(a.predictors)]
    for t in threads:
        t.start()
    samples: list[tuple[float, tuple[int, int], tuple[int, int]]] = []  # t, daemon, trainer
    events: list[tuple[float, str]] = []
    restarts: list[float] = []
    orphans = 0
    duration = a.minutes * 60
    next_hup, next_kill = a.sighup_every, a.kill_every
    while (now := time.monotonic() - t0) < duration:
        if d.proc.poll() is not None:
            events.append((now, f"daemon exited by itself ({d.proc.returncode})"))
            break
        samples.append((now, rss(d.proc.pid), rss(d.trainer_pid())))
        if now >= next_kill:
            next_kill += a.kill_every
            kids = d.kill9()
            events.append((now, "kill -9"))
            restarts.append(d.start())
            deadline = time.monotonic() + 10  # the old trainer must follow its daemon
            while any(alive(k) for k in kids) and time.monotonic() < deadline:
                time.sleep(0.2)
            orphans += sum(alive(k) for k in kids)
        elif now >= next_hup:
            next_hup += a.sighup_every
            d.proc.send_signal(signal.SIGHUP)
            events.append((now, "SIGHUP"))
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t0 - now)))
    stop.set()
    for t in threads:
        t.join(60)
    code, stop_s = d.stop() if d.proc.poll() is None else (d.proc.returncode, 0.0)
    with Store(d.state) as st:
        stored = {sig["id"]: seq for seq, sig in st.read_signals(0, 10**9)}
    lost = [i for i in rec.acked if i not in stored]
    moved = [i for i, seq in rec.acked.items() if i in stored and stored[i] != seq]
    log = d.log.read_text(errors="replace")
    result = {"acked": len(rec.acked), "stored": len(stored), "lost": len(lost),
              "moved": len(moved), "unknown": rec.unknown, "refused": dict(rec.refused),
              "predict_errors": dict(rec.predict_errors), "code": code, "stop_s": stop_s,
              "restarts": restarts, "orphans": orphans, "events": events,
              "tracebacks": log.count("Traceback"), "minutes": a.minutes, "a": a}
    table = per_minute(rec, samples, events, duration)
    png = Path(a.png)
    draw(png, rec, samples)
    text = render(result, table, command, png, a.label)
    print(text)
    if not a.no_docs:
        from docs_section import write_section
        write_section(SECTION, text)
    return 0 if not lost and not moved and code == 0 and not orphans else 1


def per_minute(rec: Record, samples, events, duration: float) -> list[dict]:
    rows = []
    for m in range(int(np.ceil(duration / 60))):
        lo, hi = m * 60, (m + 1) * 60
        lat = np.array([dt for t, dt in rec.predicts if lo <= t < hi]) * 1e3
        acks = sum(1 for t in rec.acks if lo <= t < hi)
        rs = [(r, tr) for t, r, tr in samples if lo <= t < hi and r[0]]
        ev = [e for t, e in events if lo <= t < hi]
        rows.append({
            "minute": m + 1, "acks": acks, "predicts": len(lat),
            "p50": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
            "p99": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
            "max": float(lat.max()) if len(lat) else float("nan"),
            "anon": max((r[0] for r, _ in rs), default=0) / MiB,
            "file": max((r[1] for r, _ in rs), default=0) / MiB,
            "trainer": max((tr[0] for _, tr in rs), default=0) / MiB,
            "events": ", ".join(f"{ev.count(e)}x {e}" if ev.count(e) > 1 else e
                                for e in dict.fromkeys(ev))})
    return rows


def draw(png: Path, rec: Record, samples) -> None:
    """Daemon anonymous RSS (MiB), trainer anonymous RSS (MiB), predict p99 per 10 s (ms),
    acks per second (10 s bins)."""
    ts = [t for t, _, _ in samples]
    end = max(ts, default=0.0)
    bins = np.arange(0, max(end - 10, 0) + 1e-9, 10)  # whole 10 s windows only
    p99, acks = [], []
    lat = rec.predicts
    for lo in bins:
        w = [dt * 1e3 for t, dt in lat if lo <= t < lo + 10]
        p99.append(float(np.percentile(w, 99)) if w else float("nan"))
        acks.append(sum(1 for t in rec.acks if lo <= t < lo + 10) / 10)
    render_panels([(ts, [r[0] / MiB for _, r, _ in samples]),
                   (ts, [tr[0] / MiB for _, _, tr in samples]),
                   (bins, p99), (bins, acks)], png, floors=[0.0, 0.0, 0.0, 0.0])


def render(r: dict, rows: list[dict], command: str, png: Path, label: str) -> str:
    a = r["a"]
    kills = sum(1 for _, e in r["events"] if e == "kill -9")
    hups = sum(1 for _, e in r["events"] if e == "SIGHUP")
    rel = os.path.relpath(png, ROOT / "docs")
    restart = (f"{np.mean(r['restarts']):.1f} s on average (max {max(r['restarts']):.1f} s)"
               if r["restarts"] else "none")
    lines = [
        SECTION,
        "",
        (f"**{label}.** " if label else "") + f"Command: `.venv/bin/python {command}`",
        "",
        f"Machine: {machine()}; a real `gated run` (preset {a.preset}, CPU); {a.writers} "
        f"signal clients at {a.rate:g} signals/s in all (single signals, every tenth "
        f"request a batch of 10, unique ids), {a.predictors} predict clients back to back; "
        f"SIGHUP every {a.sighup_every:g} s, kill -9 and restart every {a.kill_every:g} s; "
        f"{r['minutes']:g} minutes.",
        "",
        f"- **Acknowledged signals lost: {r['lost']}** of {r['acked']:,} acknowledged "
        f"({r['stored']:,} in the log at the end; {r['moved']} stored under another "
        f"sequence number than their acknowledgement said). Requests cut by a kill (outcome "
        f"unknown, re-sent with the same ids): {r['unknown']}; refused replies: "
        f"{r['refused'] or 'none'}; predict errors: {r['predict_errors'] or 'none'}.",
        f"- {kills} kill -9 and restart (back to serving in {restart}); processes left "
        f"behind by a killed daemon (its trainer and multiprocessing's resource tracker, "
        f"given 10 s to exit): {r['orphans']}; {hups} SIGHUP; the final SIGTERM: exit "
        f"{r['code']} in {r['stop_s']:.1f} s; tracebacks in the log: "
        f"{r['tracebacks']}.",
        "",
        "| minute | signals acked | predictions | p50 ms | p99 ms | max ms | daemon RSS MiB "
        "(anon + file) | trainer RSS MiB (anon) | events |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        lines.append(f"| {row['minute']} | {row['acks']:,} | {row['predicts']:,} | "
                     f"{row['p50']:.2f} | {row['p99']:.2f} | {row['max']:.1f} | "
                     f"{row['anon']:.0f} + {row['file']:.0f} | {row['trainer']:.0f} | "
                     f"{row['events']} |")
    lines += [
        "",
        f"![RSS and latency over time]({rel})",
        "",
        "The chart, top to bottom, against seconds: the daemon's anonymous RSS (MiB: its "
        "heap; the file-backed part is mostly LMDB's map of the growing log, which the "
        "kernel can drop), the trainer's (MiB; 0 while it restarts), predict p99 per 10 s "
        "(ms), signals acknowledged per second (10 s bins). Maxima per minute in the table "
        "(RSS: the highest sample). A predict cut by a kill waits for the restart, and its "
        "latency includes it.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
