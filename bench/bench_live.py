"""The realistic stream through a real `gated run`, in real time, scored as a gateway sees it.

bench_learning.py drives the daemon's `Trainer` in its own process on a virtual clock: the
trainer has every core and its BLAS threads to itself, and serving is one call away. Here
the daemon runs as deployed -- `gated run` (defaults, CPU, state in a temp dir), its
serving process answering `predict` on the socket while its trainer process (with the
threads `daemon.trainer_threads` gives it: on 2 cores, one) trains from the log -- and the
gateway's loop is played in real time at `--rate` signals/s: for each ordinary call of
`gated.traffic` (sessions with history, a noisy gate, corrections 5-50 signals later, a
policy change at `--switch-at`) it asks `predict` first, then sends the gate's signal with
that answer's `prediction_id`; corrections are sent when they fall due. The served
answer (rule, override memory or model, whatever answered) is scored against the TRUE
label, beside the anchor (bench/anchor.py's online hashed n-gram logistic regression,
predict-then-learn on the same signals, in this process).

Every second a `status` records the daemon's queue (signals acknowledged, not trained on)
and its trainer's drift alarms (where in the stream the trainer was when one was first
counted, and how many were withdrawn); at every 500 ordinary signals a checkpoint row,
and the probes (held-out values, the history rule: bench_learning.Probes) are asked
through `predict` on a second connection while the stream goes on. Reported: the rows,
when >= 0.95 is first reached and regained after the change, the queue (does the trainer
keep up?), predict latency as the gateway saw it, calibration against TRUE, and the CPU
seconds of the trainer, of serving and of this client (which shares the cores with the
daemon, as a gateway on the same host would).

    .venv/bin/python bench/bench_live.py --signals 12000 --switch-at 4000 --write

`--device cuda` starts the daemon on the GPU (its trainer and serving snapshot on CuPy); not
run on a device yet.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import queue
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from anchor import HashedNgramLR, anchor_text, label_weight  # noqa: E402
from bench_learning import CHECK_EVERY, Probes, _acc, _paired, _recall_block  # noqa: E402
from bench_soak import Daemon  # noqa: E402
from docs_section import machine, section_suffix_error, speed_probe  # noqa: E402
from learning_report import both_perfect, reached_95  # noqa: E402

from gated.client import Client  # noqa: E402
from gated.online import brier_score, expected_calibration_error  # noqa: E402
from gated.traffic import GatewayTraffic  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
TABLE_HEAD = ("| ordinary signals scored | signals of the stream | policy | s | gated, last 500 "
              "vs TRUE | anchor | won / lost | gated block recall | unseen-value probes gated "
              "/ anchor | block recall on unseen | history-rule probes gated / anchor | queue "
              "| trainer steps | serving version | predict p50 / p99 ms |\n" + "| --- " * 15 + "|")


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of `pid` so far (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, TypeError):
        return 0.0


class Watch(threading.Thread):
    """`status` every `every` seconds on its own connection: (t, queue depth, trainer step,
    serving version, swaps); and the trainer's drift alarms, each as the trainer's position
    in the stream (its last trained signal's seq) when `status` first counted it, and how
    many were withdrawn."""

    def __init__(self, sock: str, t0: float, every: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.sock, self.t0, self.every = sock, t0, every
        self.samples: list[tuple[float, int, int, int, int]] = []
        self.alarms: list[int] = []
        self.withdrawn = 0
        self.served: dict = {}  # status "served_logits": remembered, reused, computed
        self.stop = threading.Event()

    def run(self) -> None:
        with Client(self.sock) as c:
            while not self.stop.wait(self.every):
                s = c.status()
                self.samples.append((time.monotonic() - self.t0, s["queue_depth"], s["step"],
                                     s["version"], s["swaps"]))
                learning = s.get("learning") or {}
                new = int(learning.get("drift_detections", 0)) - len(self.alarms)
                self.alarms += [int(s["last_trained_seq"])] * max(0, new)
                self.withdrawn = int(learning.get("drift_withdrawn", self.withdrawn))
                self.served = s.get("served_logits") or self.served

    def latest(self) -> tuple[float, int, int, int, int]:
        return self.samples[-1] if self.samples else (0.0, 0, 0, 0, 0)


class ProbeAsker(threading.Thread):
    """Asks a checkpoint's probes through `predict` on its own connection, off the stream's
    thread, fills in the checkpoint's row and prints it."""

    def __init__(self, sock: str) -> None:
        super().__init__(daemon=True)
        self.sock = sock
        self.jobs: queue.Queue = queue.Queue()
        self.busy = threading.Event()  # set while a checkpoint's probes are being asked

    def run(self) -> None:
        with Client(self.sock) as c:
            while (job := self.jobs.get()) is not None:
                self.busy.set()
                row, unseen, hist, anchor = job
                pu = [c.predict(e.signal["context"], e.signal.get("history"))["p_allow"]
                      for e in unseen]
                ph = [c.predict(e.signal["context"], e.signal.get("history"))["p_allow"]
                      for e in hist]
                yu, yh = [e.true_allow for e in unseen], [e.true_allow for e in hist]
                row.update(probe_unseen=_acc(pu, yu), probe_unseen_block_recall=_recall_block(
                    pu, yu), probe_history=_acc(ph, yh),
                    probe_unseen_anchor=_acc(_anchor_ps(anchor, unseen), yu),
                    probe_history_anchor=_acc(_anchor_ps(anchor, hist), yh),
                    wrong={"unseen": wrong_by_category(pu, unseen),
                           "history": wrong_by_category(ph, hist)})
                print(row_text(row), flush=True)
                if self.jobs.empty():
                    self.busy.clear()

    def finish(self) -> None:
        self.jobs.put(None)
        self.join()


def wrong_by_category(ps: list[float], events: list) -> dict[str, tuple[int, int]]:
    """{TRUE category: (answered wrong, asked)} of probes `events` answered p_allow `ps`:
    what a checkpoint's miss is made of (an allowed unseen value leaning block, or a block
    category not yet learned)."""
    out: dict[str, tuple[int, int]] = {}
    for p, e in zip(ps, events, strict=True):
        wrong, asked = out.get(e.category, (0, 0))
        out[e.category] = (wrong + int((p >= 0.5) != e.true_allow), asked + 1)
    return out


def misses_text(rows: list[dict]) -> str:
    """The summary's line on the checkpoints where a probe set was below 0.90: its wrong
    answers by TRUE category."""
    parts = []
    for r in rows:
        for name, key in (("unseen", "probe_unseen"), ("history", "probe_history")):
            if r[key] < 0.90 or (name == "unseen" and r["probe_unseen_block_recall"] < 0.90):
                wrong = r.get("wrong", {}).get(name, {})
                parts.append(f"{r['n']} {name}: " + (", ".join(
                    f"{cat} {w} of {n}" for cat, (w, n) in sorted(wrong.items()) if w)
                    or "none wrong"))
    return ("- where a probe set was below 0.90 (or block recall on it), its wrong answers by "
            "TRUE category: " + ("; ".join(parts) or "nowhere"))


def _anchor_ps(anchor: HashedNgramLR, events: list) -> list[float]:
    return [anchor.predict_proba(anchor_text(e.signal["context"], e.signal.get("history")))
            for e in events]


def row_text(r: dict) -> str:
    return (f"| {r['n']} | {r['signals']} | {r['policy']} | {r['t']:.0f} | "
            f"{r['gated']:.3f} | {r['anchor']:.3f} | {r['wins']} / {r['losses']} | "
            f"{r['block_recall']:.2f} | "
            f"{r['probe_unseen']:.3f} / {r['probe_unseen_anchor']:.3f} | "
            f"{r['probe_unseen_block_recall']:.2f} | {r['probe_history']:.3f} / "
            f"{r['probe_history_anchor']:.3f} | {r['queue']} | {r['step']} | {r['version']} | "
            f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f} |")


def run(a: argparse.Namespace, tmp: Path) -> dict:
    traffic = GatewayTraffic(seed=a.seed)
    probe = Probes(GatewayTraffic(seed=a.seed), a.probes, a.seed + 1000)
    anchor = HashedNgramLR()
    extra = f"\n[daemon]\ntrainer_threads = {a.trainer_threads}\n" if a.trainer_threads else ""
    if a.served_logits is not None:
        extra += f"\n[serving]\nserved_logits = {a.served_logits}\n"
    if a.set:  # [train] overrides, TOML values as written (e.g. drift_wide_shrink=1.0)
        extra += "\n[train]\n" + "".join(f"{kv.split('=', 1)[0].strip()} = "
                                          f"{kv.split('=', 1)[1].strip()}\n" for kv in a.set)
    daemon = Daemon(tmp, a.preset, config=extra, device=a.device)
    try:
        print(f"(daemon ready in {daemon.start():.1f} s; log {daemon.log})", flush=True)
    except RuntimeError as e:  # its log goes with the temp dir: show its end now
        tail = daemon.log.read_text(errors="replace").splitlines()[-15:]
        raise SystemExit(f"{e}; its last lines:\n" + "\n".join(tail)) from None
    sock = str(daemon.sock)
    t0 = time.monotonic()
    watch, asker = Watch(sock, t0), ProbeAsker(sock)
    watch.start()
    asker.start()
    trainer_pid, serving_pid = daemon.trainer_pid(), daemon.proc.pid
    cpu0 = (cpu_seconds(trainer_pid), cpu_seconds(serving_pid), time.process_time())
    scored: list[tuple[float, bool]] = []     # served p_allow, TRUE allow (ordinary signals)
    anchored: list[tuple[float, bool]] = []
    bands: list[str] = []
    sources: dict[str, int] = {}
    latency: list[float] = []                 # seconds of each stream predict
    probing: list[bool] = []                  # ... asked while the probes were asked too
    acks: list[float] = []                    # seconds of each signal's acknowledgement
    rows: list[dict] = []
    late, late_at = 0.0, 0                    # how far the loop fell behind its schedule
    trace = open(a.trace, "w", buffering=1) if a.trace else None  # noqa: SIM115
    try:
        with Client(sock) as c:
            for i in range(a.signals):
                due = t0 + i / a.rate
                if time.monotonic() - due > late:
                    late, late_at = time.monotonic() - due, i
                time.sleep(max(0.0, due - time.monotonic()))
                if i == a.switch_at:
                    traffic.policy = probe.traffic.policy = "v2"
                ev = traffic.next()
                sig, text = dict(ev.signal), anchor_text(ev.signal["context"],
                                                         ev.signal.get("history"))
                if not ev.is_correction:
                    t = time.perf_counter()
                    reply = c.predict(sig["context"], sig.get("history"))
                    latency.append(time.perf_counter() - t)
                    probing.append(asker.busy.is_set())
                    scored.append((reply["p_allow"], ev.true_allow))
                    bands.append(reply["band"])
                    sources[reply["source"]] = sources.get(reply["source"], 0) + 1
                    anchored.append((anchor.predict_proba(text), ev.true_allow))
                    sig["prediction_id"] = reply["prediction_id"]
                    if trace is not None:
                        trace.write(json.dumps({
                            "i": i, "t": round(time.monotonic() - t0, 3),
                            "p": reply["p_allow"], "band": reply["band"],
                            "version": reply.get("version"), "anchor_p": anchored[-1][0],
                            "true_allow": ev.true_allow, "category": ev.category,
                            "decision": sig.get("decision"), "context": sig["context"],
                            "history": sig.get("history")}) + "\n")
                t = time.perf_counter()
                c.signal(sig)
                acks.append(time.perf_counter() - t)
                y, w = label_weight(ev.signal)
                anchor.learn(text, y, w)
                if not ev.is_correction and len(scored) % CHECK_EVERY == 0:
                    rows.append(checkpoint(scored, i + 1, anchored, latency, traffic.policy,
                                           watch.latest(), probe, anchor, asker))
        end = time.monotonic() - t0
        asker.finish()
        # after the stream: how long until the trainer has taken in the last signal
        drained = None
        while time.monotonic() - t0 < end + a.drain_wait:
            time.sleep(1.0)
            if watch.latest()[0] > end and watch.latest()[1] == 0:
                drained = watch.latest()[0] - end
                break
        cpu = (cpu_seconds(trainer_pid) - cpu0[0], cpu_seconds(serving_pid) - cpu0[1],
               time.process_time() - cpu0[2])
    finally:
        watch.stop.set()
        stopped = daemon.stop()  # (exit status, seconds) after SIGTERM
        if trace is not None:
            trace.close()
    tail = scored[-2000:]
    p, y = np.array([x for x, _ in tail]), np.array([float(t) for _, t in tail])
    allow = y[np.array(bands[-2000:]) == "allow"]
    during = [q for t, q, *_ in watch.samples if t <= end]
    return {"rows": rows, "end_s": end, "drained_s": drained, "late_s": late,
            "late_at": late_at, "cpu": cpu, "stopped": stopped,
            "queue_max": max(during, default=0), "queue_end": during[-1] if during else 0,
            "steps": watch.latest()[2], "swaps": watch.latest()[4], "sources": sources,
            "served": watch.served,
            "alarms": watch.alarms, "withdrawn": watch.withdrawn,
            "latency": np.array(latency),
            "probing": np.array(probing, dtype=bool), "acks": np.array(acks),
            "ece": expected_calibration_error(p, y),
            "brier": brier_score(p, y), "allow_precision": float(allow.mean()) if allow.size
            else float("nan"), "allow_share": allow.size / max(1, len(tail))}


def checkpoint(scored, signals, anchored, latency, policy, status, probe, anchor,
               asker) -> dict:
    """The row of the last 500 ordinary signals, `signals` into the stream (corrections
    included: learning_report.py `after_change`); the probes' columns are filled in by the
    ProbeAsker."""
    g, an = scored[-CHECK_EVERY:], anchored[-CHECK_EVERY:]
    lat = np.array(latency[-CHECK_EVERY:]) * 1e3
    unseen, hist = probe.sets()
    row = {"n": len(scored), "signals": signals, "policy": policy, "t": status[0],
           "queue": status[1], "step": status[2], "version": status[3],
           "gated": _acc(*zip(*g, strict=True)), "anchor": _acc(*zip(*an, strict=True)),
           **_paired(g, an), "block_recall": _recall_block(*zip(*g, strict=True)),
           "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
           **dict.fromkeys(("probe_unseen", "probe_unseen_block_recall", "probe_history",
                            "probe_unseen_anchor", "probe_history_anchor"), float("nan"))}
    # the anchor as it is now, asked on the asker's thread with the gated probes (~0.1 s
    # for its 400 here, off the stream's thread while this one goes on teaching it)
    asker.jobs.put((row, unseen, hist, copy.deepcopy(anchor)))
    return row


def summary(r: dict, switch_at: int, rate: float) -> list[str]:
    rows = r["rows"]
    first95, back95 = reached_95(rows, switch_at)
    lat, ack = r["latency"] * 1e3, r["acks"] * 1e3
    quiet = lat[~r["probing"]]
    trainer_cpu, serving_cpu, client_cpu = r["cpu"]
    ok = {k: sum(x[k] >= 0.90 for x in rows) for k in
          ("probe_unseen", "probe_unseen_block_recall", "probe_history")}
    return [
        f"- gated ahead of the anchor at {sum(x['gated'] > x['anchor'] for x in rows)} of "
        f"{len(rows)} checkpoints; where not: " + (", ".join(
            f"{x['n']} ({x['gated']:.3f} / {x['anchor']:.3f}, {x['wins']} won / "
            f"{x['losses']} lost{', both perfect' if both_perfect(x) else ''})"
            for x in rows if x["gated"] <= x["anchor"]) or "none"),
        f"- first checkpoint with >= 0.95 over the last 500: **"
        f"{first95 if first95 is not None else 'not reached'}**; back to >= 0.95 after the "
        f"change: **{back95 if back95 is not None else 'not within the run'}** signals",
        f"- probes >= 0.90 at {ok['probe_unseen']} (unseen values), "
        f"{ok['probe_unseen_block_recall']} (block recall on them), {ok['probe_history']} "
        f"(the history rule) of {len(rows)} checkpoints",
        misses_text(rows),
        f"- keeping up at {rate:g} signals/s: the stream took {r['end_s']:.0f} s (the client "
        f"at most {r['late_s'] * 1e3:.0f} ms behind its schedule, at signal {r['late_at']}); "
        f"the daemon's queue at most "
        f"{r['queue_max']}, {r['queue_end']} at the stream's end, "
        + (f"0 {r['drained_s']:.0f} s later" if r["drained_s"] is not None
           else "not drained in the wait")
        + f"; {r['steps']} trainer steps, {r['swaps']} swaps; SIGTERM: exit "
        f"{r['stopped'][0]} after {r['stopped'][1]:.1f} s",
        f"- the trainer scored {r['served'].get('reused', 0):,} fresh signals with the "
        f"transformer logit serving had answered their call with and ran the transformer "
        f"again for {r['served'].get('computed', 0):,} (`served_logits` in `status`)",
        "- drift alarms, at the trainer's position in the stream when `status` (asked every "
        "second) first counted each: " + (", ".join(f"{a:,}" for a in r["alarms"]) or "none")
        + f" (the change at {switch_at:,}); withdrawn {r['withdrawn']}",
        f"- CPU seconds over the stream: trainer {trainer_cpu:.0f} ({trainer_cpu / r['end_s']:.2f}"
        f" of a core), serving process {serving_cpu:.0f} ({serving_cpu / r['end_s']:.2f}), "
        f"this client and its anchor {client_cpu:.0f} ({client_cpu / r['end_s']:.2f})",
        f"- predict as the gateway saw it (round trip, {lat.size} calls): p50 "
        f"{np.percentile(lat, 50):.1f} ms, p99 {np.percentile(lat, 99):.1f} ms, max "
        f"{lat.max():.1f} ms; answered by " + ", ".join(
            f"{k} {v}" for k, v in sorted(r["sources"].items())),
        *([] if r["probing"].all() else [
            "- the same without the predicts asked while a checkpoint's probes were asked on "
            f"the second connection ({quiet.size} calls): p50 {np.percentile(quiet, 50):.1f} "
            f"ms, p99 {np.percentile(quiet, 99):.1f} ms, max {quiet.max():.1f} ms"]),
        f"- a signal's acknowledgement (round trip, {ack.size} signals): p50 "
        f"{np.percentile(ack, 50):.1f} ms, p99 {np.percentile(ack, 99):.1f} ms, max "
        f"{ack.max():.1f} ms",
        f"- last 2000 served, against the TRUE label: ECE {r['ece']:.3f}, Brier "
        f"{r['brier']:.3f}, allow-band precision {r['allow_precision']:.4f} "
        f"({100 * r['allow_share']:.0f}% answered `allow`)",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="flint", choices=("tiny", "flint"))
    ap.add_argument("--rate", type=float, default=20.0, help="signals/s, real time")
    ap.add_argument("--signals", type=int, default=12000)
    ap.add_argument("--switch-at", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--probes", type=int, default=200)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="the daemon's --device (cuda: its trainer and serving on the GPU; "
                         "never measured yet)")
    ap.add_argument("--trainer-threads", type=int, default=0,
                    help="daemon.trainer_threads (0: the daemon's default)")
    ap.add_argument("--drain-wait", type=float, default=120.0,
                    help="seconds to wait after the stream for the queue to reach 0")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a [train] setting for the daemon's config, e.g. --set "
                         "drift_wide_shrink=1.0 (TOML value)")
    ap.add_argument("--served-logits", type=int, default=None, metavar="N",
                    help="serving.served_logits (0: the trainer computes every fresh "
                         "signal's transformer logit again; default: the daemon's)")
    ap.add_argument("--trace", default=None, metavar="FILE",
                    help="one JSON line per ordinary signal predicted (the served p, band "
                         "and version, the anchor's p, the TRUE label)")
    ap.add_argument("--write", action="store_true", help="record in docs/benchmarks.md")
    ap.add_argument("--section", default=None, help="heading suffix for docs/benchmarks.md")
    a = ap.parse_args()
    if (bad := section_suffix_error("Live daemon", a.section)) is not None:
        ap.error(bad)
    where = a.device.upper() if a.device == "cpu" else "GPU (--device cuda)"
    head = (f"Machine: {machine()}"
            + (f"; {speed_probe()}" if a.device == "cpu" else "")
            + f". A real `gated run` (preset {a.preset}, {where}, defaults"
            + (f", trainer_threads {a.trainer_threads}" if a.trainer_threads else "")
            + (f", served_logits {a.served_logits}" if a.served_logits is not None else "")
            + f"); stream: gated.traffic seed {a.seed}, {a.signals} signals at {a.rate:g}/s "
            f"of real time, policy v1 -> v2 after {a.switch_at}.")
    print(head, f"\n\n{TABLE_HEAD}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gated-live-") as tmp:
        r = run(a, Path(tmp))
    lines = summary(r, a.switch_at, a.rate)
    print("\n".join(lines), flush=True)
    if a.write:
        from docs_section import write_section

        heading = (f"## Live daemon ({a.preset}, {'CPU' if a.device == 'cpu' else 'GPU'}"
                   f"{', ' + a.section if a.section else ''})")
        cmd = f"`.venv/bin/python {shlex.join(['bench/bench_live.py', *sys.argv[1:]])}`"
        write_section(heading, "\n".join([heading, "", f"Command: {cmd}", "", head, "",
                                          TABLE_HEAD, *map(row_text, r["rows"]), "", *lines]))


if __name__ == "__main__":
    main()
