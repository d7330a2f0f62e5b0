"""Fuzzing the socket: hostile frames from many concurrent clients against a real daemon.

A real `gated run` (tiny preset, CPU, default [limits] except a 2 s read timeout so
that unfinished messages cost seconds, not tens) serves its Unix socket while
``--clients`` threads send ``--frames`` frames over fresh connections, each connection
a random mix of:

- valid requests (ping, status, predict, explain, signal, signals) and requests with
  wrong field types, unknown ops, oversize fields, bin map keys;
- valid frames with bytes flipped, inserted or deleted; random bytes; hostile headers
  (str32/bin32/array32/map32 announcing gigabytes, deep nesting, big ext, invalid UTF-8);
  an occasional 9 MiB message;
- endings: the client half-closes and reads every reply (most), leaves a message
  unfinished and waits for the daemon's `timeout` (some), or resets the connection
  mid-message with SO_LINGER 0 (a killed client; some).

A client decodes what it sent with the daemon's own decoder and limits, so it knows how
many replies must come and whether the daemon must close the connection; any other
outcome counts as a mismatch.

Checked: every reply is a map with an error code from the protocol's list and never
`internal`; every connection is answered and closed within the read timeout plus a
margin (else it counts as a hang); the daemon never exits, answers a ping at the end,
logs no traceback, and stops with exit 0 on SIGTERM. The daemon's RSS is sampled every
second; then, twice, ``--hold`` connections each try to hold 4 MiB of an unfinished
message (the issue's 300 x 4 MiB) and the RSS is sampled again.

    .venv/bin/python bench/bench_fuzz.py                      # 100,000 frames, docs
    .venv/bin/python bench/bench_fuzz.py --frames 20000 --label "short run"
    .venv/bin/python bench/bench_fuzz.py --frames 2000 --no-docs
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import msgpack

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from docs_section import machine  # noqa: E402

from gated.client import Client  # noqa: E402
from gated.demo import free_port  # noqa: E402
from gated.protocol import ERROR_CODES, FrameDecoder, Limits  # noqa: E402

SECTION = "## Fuzzing the socket (CPU)"
READ_TIMEOUT_S = 2.0
MiB = 1 << 20


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


# --- frames ------------------------------------------------------------------------------------

def valid_request(rng: random.Random, n: int) -> dict:
    kind = rng.random()
    if kind < 0.2:
        return {"op": "ping", "rid": n}
    if kind < 0.3:
        return {"op": "status", "rid": n}
    if kind < 0.55:
        return {"op": rng.choice(["predict", "predict", "explain"]), "rid": n,
                "context": f"shell.exec ls {rng.randrange(10**6)}",
                "history": [f"fs.read /etc/{i}" for i in range(rng.randrange(4))]}
    if kind < 0.8:
        return {"op": "signal", "rid": n, "id": f"fz-{n}-{rng.randrange(10**9)}",
                "context": f"db.query {rng.randrange(10**6)}",
                "decision": rng.choice(["allow", "block"]), "reason": "fuzz"}
    return {"op": "signals", "rid": n, "signals": [
        {"context": f"http.get /{rng.randrange(10**6)}", "decision": "allow"}
        for _ in range(rng.randrange(1, 20))]}


def wrong_request(rng: random.Random, n: int) -> bytes:
    choices = [
        {"op": 5, "rid": n},
        {"op": "drop_tables", "rid": n},
        {"rid": n},
        {"op": "predict", "rid": n, "context": 12},
        {"op": "predict", "rid": n, "context": "x" * 70000},
        {"op": "predict", "rid": n, "context": "c", "history": ["h"] * 40},
        {"op": "signal", "rid": n, "context": "x", "decision": "maybe"},
        {"op": "signal", "rid": n, "context": "", "decision": "allow", "feedbak": "x"},
        {"op": "signals", "rid": n, "signals": "nope"},
        {"op": "signals", "rid": n, "signals": [1, None, {"context": 3}]},
        {"op": "rollback", "rid": n, "to": -3},
        {"op": "ping", "rid": {"deep": [[[[[[[[[[1]]]]]]]]]]}},
        [1, 2, 3],
        "just a string",
    ]
    obj = rng.choice(choices)
    if rng.random() < 0.15:  # a bin map key somewhere: malformed
        return pack({b"op": "ping", "rid": n})
    return pack(obj)


HOSTILE = [
    b"\x81\xa2op\xdb\xff\xff\xff\xff",          # str32 announcing 4 GiB (never completes)
    b"\x81\xa2op\xc6\x7f\xff\xff\xff",          # bin32 announcing 2 GiB
    b"\xdd\x7f\xff\xff\xff",                    # array32 of 2^31 elements
    b"\xdf\x7f\xff\xff\xff",                    # map32 of 2^31 entries
    b"\x91" * 5000 + b"\xc0",                   # nesting beyond the decoder's stack
    b"\xc9\x00\x01\x00\x00\x05" + bytes(1024),  # ext32 of 64 KiB (truncated)
    b"\x81\xa2op\xa2\xff\xfe",                  # invalid UTF-8
    b"\x81\x01\x02",                            # int map key
    b"\xc1",                                    # reserved type byte
]


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randrange(1, 6)):
        i = rng.randrange(len(b) + 1)
        how = rng.random()
        if how < 0.4 and b:
            b[min(i, len(b) - 1)] = rng.randrange(256)
        elif how < 0.7:
            b[i:i] = bytes([rng.randrange(256)])
        elif b:
            del b[min(i, len(b) - 1)]
    return bytes(b)


def frame(rng: random.Random, n: int, big: bool) -> tuple[str, bytes]:
    r = rng.random()
    if r < 0.35:
        return "valid", pack(valid_request(rng, n))
    if r < 0.55:
        return "wrong", wrong_request(rng, n)
    if r < 0.8:
        return "mutated", mutate(rng, pack(valid_request(rng, n)))
    if r < 0.9:
        return "random", rng.randbytes(rng.randrange(1, 512))
    if big and r > 0.9995:
        return "9MiB", pack({"op": "predict", "rid": n, "context": "x" * (9 * MiB)})
    return "hostile", rng.choice(HOSTILE)


# --- the daemon --------------------------------------------------------------------------------

def rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Daemon:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sock = tmp / "gated.sock"
        self.log = tmp / "daemon.log"
        cfg = tmp / "gated.toml"
        cfg.write_text(f"[limits]\nread_timeout_s = {READ_TIMEOUT_S}\n"
                       "[train]\nidle_steps_per_second = 0.0\n")
        import subprocess
        cmd = [sys.executable, "-m", "gated.cli", "run", "--config", str(cfg),
               "--state-dir", str(tmp / "state"), "--socket", str(self.sock),
               "--metrics-addr", f"127.0.0.1:{free_port()}", "--preset", "tiny",
               "--device", "cpu"]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}: "
                                   f"{self.log.read_text()[-2000:]}")
            try:
                with Client(str(self.sock), timeout=5) as c:
                    c.ping()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("daemon not ready")


# --- clients -----------------------------------------------------------------------------------

class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.frames = 0
        self.connections = 0
        self.kinds: Counter = Counter()
        self.codes: Counter = Counter()
        self.endings: Counter = Counter()
        self.hangs = 0
        self.mismatches = 0
        self.reserved = 0
        self.bad_replies: list = []
        self.mismatch_cases: list[dict] = []  # the first few, to diagnose
        self.refused = 0


def one_connection(d: Daemon, rng: random.Random, stats: Stats, budget: list[int],
                   big: bool) -> None:
    with stats.lock:
        k = min(budget[0], rng.randrange(1, 9))
        budget[0] -= k
        n0 = stats.frames + stats.reserved + 1
        stats.reserved += k
    if k <= 0:
        return
    kinds, data = [], b""
    for i in range(k):
        kind, f = frame(rng, n0 + i, big)
        kinds.append(kind)
        data += f
    ending = rng.choices(["half_close", "wait", "reset"], weights=[85, 8, 7])[0]
    if ending == "wait":  # leave a message unfinished: the daemon's `timeout` must close it
        tail = pack(valid_request(rng, n0 + k))
        data += tail[: rng.randrange(1, len(tail))]
    # The daemon decodes with the same decoder and limits: what it must answer, and whether
    # it must close the connection (a fatal error, an unfinished message, our half-close).
    dec = FrameDecoder(Limits(read_timeout_s=READ_TIMEOUT_S))
    expected = len(dec.feed(data))
    must_close = dec.closed or dec.pending_bytes > 0 or ending == "half_close"
    if not dec.closed and dec.pending_bytes and ending != "half_close":
        expected += 1  # the `timeout` reply (after a half-close the daemon just closes)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(READ_TIMEOUT_S + 10)
    try:
        s.connect(str(d.sock))
    except OSError:
        with stats.lock:
            stats.refused += 1
            stats.reserved -= k
        s.close()
        return
    replies: list = []
    hang = mismatch = closed = False
    try:
        if ending == "reset":
            try:
                s.sendall(data[: rng.randrange(1, len(data) + 1)])
            except OSError:
                pass
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            try:
                s.sendall(data)
                if ending == "half_close":
                    s.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the daemon closed first (a fatal error): its reply is still there
            unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
            while must_close or len(replies) < expected:
                try:
                    chunk = s.recv(1 << 16)
                except TimeoutError:
                    hang = True
                    break
                except ConnectionResetError:
                    closed = True
                    break
                if not chunk:
                    closed = True
                    break
                unpacker.feed(chunk)
                replies.extend(unpacker)
            mismatch = not hang and (len(replies) != expected or (must_close and not closed))
    finally:
        s.close()
    with stats.lock:
        stats.reserved -= k
        stats.frames += k
        stats.connections += 1
        stats.kinds.update(kinds)
        stats.endings[ending] += 1
        stats.hangs += hang
        stats.mismatches += mismatch
        if mismatch and len(stats.mismatch_cases) < 5:
            stats.mismatch_cases.append({
                "kinds": kinds, "ending": ending, "expected": expected,
                "must_close": must_close, "closed": closed,
                "codes": [r.get("error", {}).get("code") if isinstance(r, dict)
                          and not r.get("ok") else "ok" for r in replies],
                "head": data[:48]})
        for r in replies:
            if not isinstance(r, dict) or not isinstance(r.get("ok"), bool):
                stats.bad_replies.append(r)
            elif not r["ok"]:
                code = r.get("error", {}).get("code")
                stats.codes[code] += 1
                if code not in ERROR_CODES or code == "internal":
                    stats.bad_replies.append(r)
            else:
                stats.codes["ok"] += 1


def hold_phase(d: Daemon, conns: int) -> dict:
    """``conns`` connections each send 4 MiB of a message announcing 6 MiB and keep the
    connection open: what the daemon holds is bounded by limits.max_buffered_bytes."""
    before = rss(d.proc.pid)
    head = b"\x81\xa2op\xc6" + (6 * MiB).to_bytes(4, "big")
    chunk = b"x" * MiB
    socks, overloaded, peak = [], 0, before
    for _ in range(conns):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(str(d.sock))
            s.sendall(head)
            for _ in range(4):
                s.sendall(chunk)
        except OSError:
            pass
        socks.append(s)
        peak = max(peak, rss(d.proc.pid))
    time.sleep(0.5)
    for s in socks:
        s.settimeout(0.05)
        try:
            data = s.recv(4096)
            if b"overloaded" in data:
                overloaded += 1
        except OSError:
            pass
    peak = max(peak, rss(d.proc.pid))
    for s in socks:
        s.close()
    time.sleep(1.0)
    return {"conns": conns, "before": before, "peak": peak, "after": rss(d.proc.pid),
            "overloaded": overloaded}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=100_000)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--hold", type=int, default=300, help="connections of the hold phase")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="", help="e.g. 'short run', shown in the heading")
    ap.add_argument("--no-docs", action="store_true")
    a = ap.parse_args(argv)
    command = "bench/bench_fuzz.py " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    tmp = Path(tempfile.mkdtemp(prefix="gated-fuzz-"))
    d = Daemon(tmp)
    base = rss(d.proc.pid)
    samples: list[tuple[float, int]] = []
    stats, budget = Stats(), [a.frames]
    done = threading.Event()

    def sampler() -> None:
        t0 = time.monotonic()
        while not done.is_set():
            samples.append((time.monotonic() - t0, rss(d.proc.pid)))
            done.wait(1.0)

    def client(k: int) -> None:
        rng = random.Random(a.seed * 1000 + k)
        while budget[0] > 0 and d.proc.poll() is None:
            one_connection(d, rng, stats, budget, big=k == 0)

    t0 = time.monotonic()
    threads = [threading.Thread(target=sampler, daemon=True)]
    threads += [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
    for t in threads:
        t.start()
    last = time.monotonic()
    while any(t.is_alive() for t in threads[1:]):
        time.sleep(0.5)
        if time.monotonic() - last > 10:
            last = time.monotonic()
            print(f"  {stats.frames:,} frames, {stats.connections:,} connections, RSS "
                  f"{rss(d.proc.pid) / MiB:.0f} MiB", flush=True)
    elapsed = time.monotonic() - t0
    crashed = d.proc.poll() is not None
    alive = False
    if not crashed:
        with Client(str(d.sock), timeout=10) as c:
            alive = c.ping()["pong"] is True
    held = [hold_phase(d, a.hold) for _ in range(2)] if not crashed else None
    done.set()
    code = None
    t_stop = time.monotonic()
    if not crashed:
        d.proc.send_signal(signal.SIGTERM)
        code = d.proc.wait(timeout=60)
    stop_s = time.monotonic() - t_stop
    log = d.log.read_text(errors="replace")
    tracebacks = log.count("Traceback")
    rss_vals = [r for t, r in samples if r and t <= elapsed]  # the frames phase only
    result = {
        "frames": stats.frames, "connections": stats.connections, "elapsed": elapsed,
        "clients": a.clients, "kinds": stats.kinds, "codes": stats.codes,
        "endings": stats.endings, "hangs": stats.hangs, "bad": len(stats.bad_replies),
        "mismatches": stats.mismatches,
        "crashed": crashed, "alive": alive, "exit": code, "stop_s": stop_s,
        "tracebacks": tracebacks, "refused": stats.refused, "base": base,
        "rss_max": max(rss_vals) if rss_vals else 0, "rss_end": rss_vals[-1] if rss_vals else 0,
        "held": held,
    }
    text = render(result, command, a.label)
    print(text)
    if stats.bad_replies:
        print("bad replies (first 5):", stats.bad_replies[:5])
    for case in stats.mismatch_cases:
        print("mismatch:", case)
    if not a.no_docs:
        from docs_section import write_section
        write_section(SECTION, text)
    ok = not crashed and alive and code == 0 and not stats.hangs and not stats.bad_replies \
        and not tracebacks and not stats.mismatches
    return 0 if ok else 1


def render(r: dict, command: str, label: str) -> str:
    mib = lambda n: f"{n / MiB:.0f} MiB"  # noqa: E731
    kinds = ", ".join(f"{k} {v:,}" for k, v in r["kinds"].most_common())
    codes = ", ".join(f"`{k}` {v:,}" for k, v in r["codes"].most_common())
    endings = ", ".join(f"{k} {v:,}" for k, v in r["endings"].most_common())
    lines = [
        SECTION,
        "",
        (f"**{label}.** " if label else "")
        + f"Command: `.venv/bin/python {command}`",
        "",
        f"Machine: {machine()}; a real `gated run` (tiny preset, CPU, default `[limits]` "
        f"but `read_timeout_s = {READ_TIMEOUT_S:g}`), {r['clients']} client threads, fresh "
        "connections of 1-8 frames each.",
        "",
        "| | |",
        "| --- | --- |",
        f"| frames sent | {r['frames']:,} over {r['connections']:,} connections in "
        f"{r['elapsed']:.0f} s |",
        f"| frames by kind | {kinds} |",
        f"| connection endings | {endings} (reset = SO_LINGER 0 mid-message, a killed client) |",
        f"| replies by code | {codes} |",
        f"| replies that are not a map with a listed code, or `internal` | {r['bad']} |",
        f"| hangs (no reply or close within read timeout + 10 s) | {r['hangs']} |",
        f"| connections answered otherwise than the decoder predicts (count of replies, "
        f"close) | {r['mismatches']} |",
        f"| crashes (daemon exited) | {int(r['crashed'])}; ping at the end: "
        f"{'ok' if r['alive'] else 'FAILED'}; SIGTERM: exit {r['exit']} in "
        f"{r['stop_s']:.1f} s; tracebacks in the log: {r['tracebacks']} |",
        f"| daemon RSS | {mib(r['base'])} at start, at most {mib(r['rss_max'])} during the "
        f"frames, {mib(r['rss_end'])} at their end (sampled every second) |",
    ]
    for i, h in enumerate(r["held"] or []):
        lines.append(f"| hold phase, round {i + 1} | {h['conns']} connections each sending "
                     f"4 MiB of an unfinished 6 MiB message: RSS {mib(h['before'])} -> at "
                     f"most {mib(h['peak'])} ({h['overloaded']} got `overloaded`), "
                     f"{mib(h['after'])} after they closed |")
    lines += [
        "",
        "Before issue 13's fixes the same hold phase took the daemon from 47 MB to 1,272 MB "
        "(300 x 4 MiB, the issue's probe); on this machine, the code before the fixes "
        "(commit 1f10fee) went from 48 to 1,277 MiB, and a connection that sent only a "
        "4 GiB str32 header was still open, unanswered, 15 s later (now: `timeout` after "
        "`read_timeout_s`). `limits.max_buffered_bytes` (64 MiB) now bounds "
        "what all connections together can hold; a second round peaks where the first did "
        "(bounded, not cumulative).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
