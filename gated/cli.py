"""Command line: `gated run|send|predict|explain|status|rollback|resume|report|demo|backup|
inspect|audit`.

Flags override the config file, the file overrides the defaults (gated.example.toml).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from .config import DEFAULT_SOCKET, DEFAULT_STATE_DIR


def _add_socket(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket", default=DEFAULT_SOCKET, help="daemon socket path")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gated", description="online gate-learning daemon")
    sub = ap.add_subparsers(dest="cmd", required=True)

    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", help="TOML config file (see gated.example.toml)")
    run.add_argument("--state-dir", help="LMDB state directory")
    run.add_argument("--socket", help="Unix socket path (ignored under socket activation)")
    run.add_argument("--metrics-addr", help="HOST:PORT of the Prometheus endpoint")
    run.add_argument("--device", choices=["auto", "cpu", "cuda"])
    run.add_argument("--preset", choices=["tiny", "flint"])
    run.add_argument("--role", choices=["single", "edge", "trainer"],
                     help="cluster role (docs/cluster.md); default: cluster.role, single")
    run.add_argument("--reinit", action="store_true",
                     help="start from fresh weights even if a checkpoint exists (signals kept)")

    send = sub.add_parser("send", help="send one signal, or a JSONL file of signals")
    _add_socket(send)
    send.add_argument("--file", help="JSONL file, one signal map per line")
    send.add_argument("--batch", type=int, default=256, help="signals per request with --file")
    send.add_argument("--context")
    send.add_argument("--decision", choices=["allow", "block"])
    send.add_argument("--feedback", choices=["confirm", "override_allow", "override_block",
                                             "false_positive", "false_negative"])
    send.add_argument("--reason")
    send.add_argument("--id")
    send.add_argument("--history", action="append", help="a previous call (repeatable)")
    send.add_argument("--prediction-id", help="the prediction_id of the predict reply this "
                                              "outcome belongs to")

    for name in ("predict", "explain"):
        p = sub.add_parser(name, help=f"{name} a tool call")
        _add_socket(p)
        p.add_argument("context")
        p.add_argument("--history", action="append")

    st = sub.add_parser("status", help="the daemon's status")
    _add_socket(st)

    rb = sub.add_parser("rollback", help="republish a kept earlier weights version")
    _add_socket(rb)
    rb.add_argument("--to", type=int, required=True, help="the version to go back to")
    rb.add_argument("--pause", action="store_true",
                    help="pause training after it (until `gated resume`)")
    rb.add_argument("--timeout", type=float, default=30.0)
    rs = sub.add_parser("resume", help="train again after rollback --pause")
    _add_socket(rs)

    rep = sub.add_parser("report", help="PNG of loss and alignment over time")
    rep.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    rep.add_argument("--out", default="gated-report.png")
    rep.add_argument("--period", type=float, default=3600.0,
                     help="seconds per row of the shadow evaluation over time")

    demo = sub.add_parser("demo", help="run a daemon against a synthetic gateway until it "
                                       "converges")
    # tiny by default: it converges in well under a minute on a laptop CPU; flint, the
    # daemon default, takes much longer there (see docs/benchmarks.md, learning).
    demo.add_argument("--preset", default="tiny", choices=["tiny", "flint"])
    demo.add_argument("--rate", type=float, default=200.0, help="signals per second")
    demo.add_argument("--max-signals", type=int, default=20000,
                      help="fail if not converged after this many signals")
    demo.add_argument("--max-seconds", type=float, default=900.0)
    demo.add_argument("--state-dir", help="keep the demo's state here (default: a temp dir)")

    bk = sub.add_parser("backup", help="write a consistent compact copy of the state")
    bk.add_argument("dest")
    bk.add_argument("--state-dir", default=DEFAULT_STATE_DIR)

    ins = sub.add_parser("inspect", help="counts, versions, step and sizes of a state dir")
    ins.add_argument("state_dir", nargs="?", default=DEFAULT_STATE_DIR)
    ins.add_argument("--json", action="store_true")

    au = sub.add_parser("audit", help="the audit log of served predictions (read-only)")
    au.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    au.add_argument("--since", default="3600",
                    help="seconds ago (e.g. 600) or an ISO time (2026-11-23T09:00:00, local "
                         "time unless it has an offset); default: the last hour")
    au.add_argument("--tool", help="only predictions of this tool (the context's leading "
                                   "word)")
    au.add_argument("--limit", type=int, default=0, help="only the newest N records")
    au.add_argument("--json", action="store_true", help="one JSON array")
    return ap


def _print(obj: dict) -> None:
    print(json.dumps(obj, indent=2, default=str))


def cmd_send(a: argparse.Namespace) -> int:
    from .client import Client, GatedError

    with Client(a.socket) as c:
        if a.file:
            lines = [ln for ln in Path(a.file).read_text().splitlines() if ln.strip()]
            sent = failed = 0
            t0 = time.monotonic()
            for i in range(0, len(lines), a.batch):
                chunk = [json.loads(ln) for ln in lines[i : i + a.batch]]
                results = c.signals(chunk)
                failed += sum(1 for r in results if "error" in r)
                sent += len(chunk)
                rate = sent / max(time.monotonic() - t0, 1e-9)
                bar = "#" * int(30 * sent / len(lines))
                print(f"\r[{bar:<30}] {sent}/{len(lines)} signals, {failed} rejected, "
                      f"{rate:,.0f}/s", end="", file=sys.stderr, flush=True)
            print(file=sys.stderr)
            return 1 if failed else 0
        if not a.context or not a.decision:
            print("gated send: give --context and --decision, or --file", file=sys.stderr)
            return 2
        sig = {k: v for k, v in {"context": a.context, "decision": a.decision,
                                 "feedback": a.feedback, "reason": a.reason, "id": a.id,
                                 "history": a.history,
                                 "prediction_id": a.prediction_id}.items() if v is not None}
        try:
            _print(c.signal(sig))
        except GatedError as e:
            print(f"rejected: {e}", file=sys.stderr)
            return 1
    return 0


def cmd_query(a: argparse.Namespace) -> int:
    from .client import Client

    with Client(a.socket) as c:
        if a.cmd == "status":
            _print(c.status())
        elif a.cmd == "predict":
            _print(c.predict(a.context, a.history))
        else:
            _print(c.explain(a.context, a.history))
    return 0


def cmd_rollback(a: argparse.Namespace) -> int:
    """Request the rollback, then wait until the daemon serves the republished weights."""
    import time

    from .client import Client, GatedError

    with Client(a.socket) as c:
        if a.cmd == "resume":
            _print(c.resume())
            return 0
        try:
            before = c.rollback(a.to, a.pause)["version"]
        except GatedError as e:
            print(f"rollback refused: {e}", file=sys.stderr)
            return 1
        deadline = time.monotonic() + a.timeout
        while time.monotonic() < deadline:
            st = c.status()
            if st["version"] > before:
                print(f"version {a.to} republished as version {st['version']}; training "
                      f"{'paused (gated resume)' if st.get('paused') else 'continues'}")
                return 0
            time.sleep(0.2)
    print(f"the daemon did not publish within {a.timeout:g}s; see its log", file=sys.stderr)
    return 1


def cmd_report(a: argparse.Namespace) -> int:
    from .online.per_tool import PerTool, format_table
    from .report import render
    from .store import Store

    store = Store(a.state_dir)
    try:
        history = store.read_metrics(limit=100_000)
        head = store.checkpoint_info() or {}
    finally:
        store.close()
    n = render(history, a.out)
    print(f"wrote {a.out} ({n} steps)")
    per_tool = PerTool()
    per_tool.load(((head.get("extra") or {}).get("monitor") or {}).get("per_tool"))
    stats = per_tool.stats()
    if stats:
        print(f"\nper tool, at the last checkpoint (step {head.get('step', 0)}; progressive "
              "validation, block is positive):")
        print(format_table(stats))
    from .online.shadow import format_report
    from .store import read_audit

    print()
    print(format_report(read_audit(a.state_dir), a.period))
    return 0


def cmd_backup(a: argparse.Namespace) -> int:
    from .store import backup

    backup(a.state_dir, a.dest)
    print(f"backup of {a.state_dir} written to {a.dest}")
    return 0


def cmd_inspect(a: argparse.Namespace) -> int:
    from .store import format_inspect, inspect

    info = inspect(a.state_dir)
    print(json.dumps(info, indent=2, default=str) if a.json else format_inspect(info))
    return 0


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: a number of seconds before ``now``, or an ISO 8601 time (local time
    when it has no offset) -> unix seconds."""
    from datetime import datetime

    now = time.time() if now is None else now
    try:
        return now - float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise SystemExit(f"gated audit: --since {text!r} is neither seconds nor an ISO time "
                         "(e.g. 600 or 2026-11-23T09:00:00)") from None


def format_audit(rec: dict) -> str:
    """One audit record for a person: time, id, op, source, band, p_allow, version,
    latency, tool, and the outcome once a signal referenced it."""
    from datetime import datetime

    when = datetime.fromtimestamp(rec["ts"]).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    why = rec.get("rule") or rec.get("override") or ""
    line = (f"{when}  {rec['prediction_id']}  {rec.get('op', 'predict'):<7}  "
            f"{rec['source']:<8}  {rec['band']:<5}  p_allow {rec['p_allow']:.3f}  "
            f"v{rec['version']:<5}  {rec['latency_ms']:8.2f} ms  {rec.get('tool', '')}")
    if why:
        line += f"  [{why}]"
    if "outcome" in rec:
        line += f"  -> {rec['outcome']} (seq {rec.get('seq')})"
    return line


def cmd_audit(a: argparse.Namespace) -> int:
    from .store import read_audit

    records = read_audit(a.state_dir, since=parse_since(a.since), tool=a.tool,
                         limit=max(0, a.limit))
    if a.json:
        print(json.dumps(records, indent=2))
    else:
        for rec in records:
            print(format_audit(rec))
        print(f"{len(records)} prediction(s)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                                                   "%(message)s")
    if a.cmd == "run":
        from .daemon.server import run_from_args

        return run_from_args(a)
    if a.cmd == "demo":
        from .demo import run_demo

        return run_demo(a)
    handlers = {"send": cmd_send, "predict": cmd_query, "explain": cmd_query,
                "status": cmd_query, "report": cmd_report, "backup": cmd_backup,
                "inspect": cmd_inspect, "rollback": cmd_rollback, "resume": cmd_rollback,
                "audit": cmd_audit}
    return handlers[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
