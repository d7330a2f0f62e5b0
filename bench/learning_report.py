"""The learning benchmark's report: each checkpoint's table row, the run's summary lines
and the unseen-value probes by category (bench_learning.py measures, this module words it).

A run's result is the dict `bench_learning.run` returns: its `rows` (one per checkpoint),
`switch_at`, the calibration and allow-band figures of the last 2,000 scored, the steps
and the queue, the drift verdicts, and `stopped_at` when SIGTERM cut it short."""

from __future__ import annotations

import numpy as np


def _significant(r: dict) -> int:
    """+1 / -1 when gated is ahead / behind the anchor at this checkpoint by more than two
    standard errors of McNemar's statistic, |wins - losses| > 2 sqrt(wins + losses); else 0."""
    w, lo = r["wins"], r["losses"]
    if abs(w - lo) <= 2 * np.sqrt(w + lo):
        return 0
    return 1 if w > lo else -1


def both_perfect(r: dict) -> bool:
    """Both learners right on every one of the checkpoint's last 500: a tie that no learner
    could win, told apart in the summary from a tie or a loss by a few signals (the target
    "ahead at every checkpoint" is still counted strictly: such a checkpoint is not ahead).
    Both scored on the same 500, so neither won nor lost a signal there."""
    return r["gated"] == r["anchor"] == 1.0


def after_change(x: dict, switch: int) -> int:
    """How many signals of the stream (corrections included, the unit of `--switch-at`)
    checkpoint `x` came after the change; <= 0: before it. Why not its `n`: a checkpoint
    is every 500 *ordinary* signals scored, and by the change the stream has also carried
    ~190 corrections, so the checkpoint at n = 4,001 came ~190 signals into the new
    policy, not 1 (the reports before 2026-11-30 counted n - switch)."""
    return x["signals"] - switch


def before_change(rows: list[dict], switch: int) -> list[dict]:
    """The checkpoints that came before the change (`after_change` <= 0), oldest first."""
    return [x for x in rows if after_change(x, switch) <= 0]


def row_text(r: dict) -> str:
    """One checkpoint's row of the `TABLE_HEAD` table."""
    return (f"| {r['n']} | {r['signals']} | {r['policy']} | {r['gated']:.3f} | {r['anchor']:.3f} | "
            f"{r['gated_uncalibrated']:.3f} | {r['wide_alone']:.3f} / {r['deep_alone']:.3f} | "
            f"{r['gated_block_recall']:.2f} | {r['probe_unseen']:.3f} / "
            f"{r['probe_unseen_anchor']:.3f} | {r.get('probe_unseen_raw', float('nan')):.3f} / "
            f"{r.get('probe_unseen_wide', float('nan')):.3f} | "
            f"{r['probe_history']:.3f} / {r['probe_history_anchor']:.3f} / "
            f"{r.get('probe_history_raw', float('nan')):.3f} / "
            f"{r.get('probe_history_wide', float('nan')):.3f} / "
            f"{r.get('probe_history_live', float('nan')):.3f} | {r['ece']:.3f} | "
            f"{r['probe_unseen_block_recall']:.2f} | {_share(r):.2f} | {r['queue']} | "
            f"{r['virtual_s']} |")


def _share(r: dict) -> float:
    """The transformer's share of the served logit, (a + d) / a (online/calibration.py)."""
    return (r["calibration_a"] + r.get("calibration_d", 0.0)) / r["calibration_a"]


TABLE_HEAD = ("| ordinary signals scored | signals of the stream (corrections included) | "
              "policy | gated, last 500 vs TRUE | anchor, last 500 | "
              "gated before calibration | wide part / transformer part, the other at its mean | "
              "gated block recall | unseen-value probes gated / "
              "anchor | unseen, gated before calibration / wide part alone | history-rule "
              "probes gated / anchor / before calibration / wide logit alone / the trainer's "
              "wide learner | ECE (vs "
              "signal labels) | block recall on unseen | "
              "transformer's share | queue | virtual s |\n"
              "| ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | --- | ---: | --- | ---: "
              "| ---: | ---: | ---: | ---: |")


def by_category(r: dict) -> list[str]:
    """The unseen-value probes by TRUE category, at the last checkpoint before the change,
    at the end, and at every checkpoint where they or block recall on them fell below 0.90
    (an unseen-value miss can be allowed calls answered block, which block recall does not
    see): which categories' held-out values the gate generalises to, and which it missed
    where the target was missed (some held-out values share nothing a learner could read
    with the trained ones: a typo of a package name that never appears in the stream, a
    paste host with a new name)."""
    rows, switch = r["rows"], r["switch_at"]
    pre = before_change(rows, switch)
    points = [x for x in rows if x is rows[-1] or (pre and x is pre[-1])
              or x["probe_unseen_block_recall"] < 0.90 or x["probe_unseen"] < 0.90]
    head = " | ".join(f"@{x['n']} ({x['policy']}) gated / anchor" for x in points)
    out = [f"| unseen-value probes by TRUE category (n at the end) | {head} |",
           "| --- |" + " --- |" * len(points)]
    for cat in sorted(rows[-1]["unseen_by_category"], key=lambda c: (c != "allow", c)):
        cells = []
        for x in points:
            n, g, a = x["unseen_by_category"].get(cat, (0, float("nan"), float("nan")))
            cells.append(f"{g:.2f} / {a:.2f}" if n else "-")
        out.append(f"| {cat} ({rows[-1]['unseen_by_category'][cat][0]}) | {' | '.join(cells)} |")
    return out


def _drift_verdict(began: int, confirmed: bool, dropped: int, alarmed_at: int = -1,
                   decided_at: int = -1) -> str:
    """One drift alarm of a run's `drifts` (bench_learning.py `DriftLog`; results from
    before the positions were kept have the first three fields only)."""
    where = (f" (alarm at {alarmed_at:,}, verdict at {decided_at:,})"
             if alarmed_at >= 0 and decided_at >= 0 else "")
    return f"{began:,}{where} " + (f"confirmed, {dropped:,} replay examples dropped"
                                   if confirmed else "withdrawn, replay kept")


def _every_checkpoint(rows: list[dict], settled: int = 2000) -> str:
    """The probes over all checkpoints, not at one: a single checkpoint's history-rule
    figure is one draw from a wide spread (docs/learning.md, "The wide path's rate"), so a
    comparison between runs reads these counts and means as well. The history rule's mean
    is given per policy (after the change its probes are e-mail only), before the change
    from `settled` signals on."""
    def worst(key: str) -> str:
        x = min(rows, key=lambda x: x[key])
        return f"lowest {x[key]:.3f} at {x['n']}"

    def mean(part: list[dict]) -> str:
        return (f"{np.mean([x['probe_history'] for x in part]):.3f} (anchor "
                f"{np.mean([x['probe_history_anchor'] for x in part]):.3f})" if part else "-")
    first = rows[0]["policy"]
    before = [x for x in rows if x["policy"] == first and x["n"] >= settled]
    after = [x for x in rows if x["policy"] != first]

    def halves(key: str) -> str:
        return " / ".join(f"{np.mean([x[key] for x in part]):.3f}" if part else "-"
                          for part in (before, after))
    return (f"- over all {len(rows)} checkpoints: unseen-value probes >= 0.90 at "
            f"{sum(x['probe_unseen'] >= 0.90 for x in rows)} ({worst('probe_unseen')}), "
            f"block recall on them >= 0.90 at "
            f"{sum(x['probe_unseen_block_recall'] >= 0.90 for x in rows)} "
            f"({worst('probe_unseen_block_recall')}); "
            f"history rule >= 0.90 at {sum(x['probe_history'] >= 0.90 for x in rows)} "
            f"({worst('probe_history')}), its mean before the change from {settled} signals "
            f"on {mean(before)}, after it {mean(after)}; its block members (the secret read "
            f"in the window) >= 0.90 at {sum(x['probe_history_block'] >= 0.90 for x in rows)}"
            f", mean before / after the change {halves('probe_history_block')}, their allow "
            f"twins {halves('probe_history_twins')}")


def _right_after(r: dict) -> list[str]:
    """The first checkpoint after the change beside what answering as before would score
    there (`Probes.changed_share`)."""
    after = [x for x in r["rows"] if after_change(x, r["switch_at"]) > 0]
    if not after or r.get("probes_changed") is None:
        return []
    x, changed = after[0], r["probes_changed"]
    return [f"- the first checkpoint after the change, {after_change(x, r['switch_at'])} "
            f"signals of the stream into the new policy ({x['n']} ordinary signals scored)"
            f": the change flipped the TRUE label of {100 * changed:.0f}% of the "
            f"unseen-value probes, so answering every one as before it scores "
            f"{1 - changed:.3f}; gated {x['probe_unseen']:.3f}, the anchor "
            f"{x['probe_unseen_anchor']:.3f}"]


def reached_95(rows: list[dict], switch: int) -> tuple[int | None, int | None]:
    """(the signals of the stream by the first checkpoint before the change with gated >=
    0.95 over its last 500, the signals after the change until a checkpoint is back at >=
    0.95), both counted in signals of the stream, corrections included (`after_change`);
    None: not reached."""
    first95 = next((x["signals"] for x in rows
                    if after_change(x, switch) <= 0 and x["gated"] >= 0.95), None)
    back95 = next((after_change(x, switch) for x in rows
                   if after_change(x, switch) > 0 and x["gated"] >= 0.95), None)
    return first95, back95


def summary(r: dict) -> list[str]:
    rows, switch = r["rows"], r["switch_at"]
    beats = all(x["gated"] > x["anchor"] for x in rows)
    perfect = sum(both_perfect(x) for x in rows)
    first95, back95 = reached_95(rows, switch)
    pre = before_change(rows, switch)
    last_pre = pre[-1] if pre else rows[-1]
    return [
        f"- gated ahead of the anchor at every checkpoint: **{'yes' if beats else 'no'}** "
        f"({sum(x['gated'] > x['anchor'] for x in rows)} of {len(rows)}"
        + (f"; both perfect, a tie no learner can win, at {perfect}" if perfect else "") + ")",
        f"- paired with the anchor on the same signals (McNemar, two standard errors): "
        f"significantly ahead at {sum(_significant(x) > 0 for x in rows)}, significantly "
        f"behind at {sum(_significant(x) < 0 for x in rows)} of {len(rows)} checkpoints; "
        f"where behind: " + (", ".join(f"{x['n']} ({x['wins']} won / {x['losses']} lost"
                                      f"{', both perfect' if both_perfect(x) else ''})"
                                      for x in rows if x["gated"] <= x["anchor"]) or "none"),
        "- first checkpoint with >= 0.95 over the last 500: "
        + (f"**{first95}** signals of the stream" if first95 is not None else "**not reached**")
        + " (target <= 4000)",
        "- back to >= 0.95 after the policy change: "
        + (f"**{back95}** signals of the stream after it" if back95 is not None
           else "**not within the run**") + " (target <= 3000)",
        f"- before the change: unseen-value probes {last_pre['probe_unseen']:.3f} (anchor "
        f"{last_pre['probe_unseen_anchor']:.3f}), block recall on them "
        f"{last_pre['probe_unseen_block_recall']:.3f}; history-rule probes "
        f"{last_pre['probe_history']:.3f} (anchor {last_pre['probe_history_anchor']:.3f})",
        _every_checkpoint(rows),
        *_right_after(r),
        f"- last 2000 scored, against the TRUE label: ECE {r['ece_true']:.3f}, Brier "
        f"{r['brier_true']:.3f}, allow-band precision {r['allow_band_precision']:.4f} "
        f"({100 * r['allow_band_share']:.0f}% of calls in the allow band)",
        "- the allow band, TRUE blocks answered `allow` / calls answered `allow`, as served "
        "(closed until {} scored and for {} after an alarm of the drift detector or the allow "
        "band's guard) and [with the band always "
        "open]: ".format(*r["allow_band_wait"])
        + "; ".join(f"{k} {a} / {b} [{c} / {d}] of {n}"
                    for k, (a, b, c, d, n) in r["allow_band_phases"].items()),
        *([f"- cut short by SIGTERM after {r['stopped_at'][0]:,} of {r['stopped_at'][1]:,} "
           f"signals"] if r.get("stopped_at") else []),
        f"- keeping up: {r['steps']} steps in {r['virtual_s']} s of virtual time, queue max "
        f"{r['max_queue']}, at the end {r['final_queue']} signals",
        "- drift alarms (signal where the change began, by the estimate; the trainer's "
        "position at the alarm and at its verdict, after the corrections of the wait): "
        + (", ".join(_drift_verdict(*v) for v in r.get("drifts", [])) or "none")
        + "; the allow band's guard: {:.0f} alarms".format(
            r["rows"][-1].get("allow_guard_alarms", 0)),
    ]
