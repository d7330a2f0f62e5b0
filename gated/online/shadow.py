"""Shadow evaluation: how often gated's SERVED answers agreed with what the gateway then
decided, from the audit log (daemon/trust.py links each outcome to its prediction).

In shadow mode the gateway keeps deciding by its own rules, asks gated `predict` for every
call only to record the answer, and sends its decision as a signal carrying the reply's
`prediction_id`. The audit log then holds, per served prediction, gated's p_allow and band
and the gateway's outcome; this module turns those records into the evidence an operator
reads before letting gated decide: agreement over time, by band and by tool.

A prediction agrees when its p_allow >= 0.5 matches an allow outcome ("ask" answers are
judged by that side too, as the served-alignment gauge does).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable

BANDS = ("allow", "ask", "block")


def _agrees(rec: dict) -> bool:
    return (rec["p_allow"] >= 0.5) == (rec["outcome"] == "allow")


def linked(records: Iterable[dict]) -> list[dict]:
    """The audit records that have an outcome (the gateway's signal referenced them)."""
    return [r for r in records if r.get("outcome") in ("allow", "block")]


def over_time(records: list[dict], period_s: float) -> list[dict]:
    """Agreement per period (oldest first): start ts, linked predictions, agreement, and
    agreement and count per band."""
    buckets: dict[int, list[dict]] = defaultdict(list)
    for r in records:
        buckets[int(r["ts"] // period_s)].append(r)
    rows = []
    for k in sorted(buckets):
        rs = buckets[k]
        row = {"start": k * period_s, "n": len(rs), "agreement": _share(rs)}
        for band in BANDS:
            b = [r for r in rs if r.get("band") == band]
            row[band] = (len(b), _share(b))
        rows.append(row)
    return rows


def by_key(records: list[dict], key: str, top: int = 10) -> list[tuple[str, int, float]]:
    """(value, linked predictions, agreement) per value of `key` (e.g. "tool"), busiest
    first, the rest pooled as "other"."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        groups[str(r.get(key, "?"))].append(r)
    ranked = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    rows = [(name, len(rs), _share(rs)) for name, rs in ranked[:top]]
    rest = [r for _, rs in ranked[top:] for r in rs]
    if rest:
        rows.append(("other", len(rest), _share(rest)))
    return rows


def _share(rs: list[dict]) -> float:
    return sum(_agrees(r) for r in rs) / len(rs) if rs else float("nan")


def _pct(x: float) -> str:
    return "   -  " if x != x else f"{100 * x:5.1f}%"


def format_report(records: list[dict], period_s: float = 3600.0) -> str:
    """The shadow evaluation as text: over time, by band, by tool."""
    rs = linked(records)
    if not rs:
        return ("shadow evaluation: no served prediction has an outcome yet (send the "
                "gateway's decisions as signals with the predict reply's prediction_id)")
    out = [f"shadow evaluation: {len(rs)} served predictions with the gateway's outcome, "
           f"agreement {_pct(_share(rs)).strip()}", "",
           f"{'period start (UTC)':<20} {'linked':>7} {'agree':>7}   "
           + "   ".join(f"{b:>5} n / agree" for b in BANDS)]
    for row in over_time(rs, period_s):
        start = time.strftime("%Y-%m-%d %H:%M", time.gmtime(row["start"]))
        bands = "   ".join(f"{row[b][0]:>7} / {_pct(row[b][1])}" for b in BANDS)
        out.append(f"{start:<20} {row['n']:>7} {_pct(row['agreement'])}   {bands}")
    out += ["", f"{'tool':<24} {'linked':>7} {'agree':>7}"]
    out += [f"{name[:24]:<24} {n:>7} {_pct(a)}" for name, n, a in by_key(rs, "tool")]
    return "\n".join(out)
