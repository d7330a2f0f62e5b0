"""Where gated and the anchor disagree: a trace of `bench_learning.py --trace`, grouped.

A checkpoint lost by a few signals says little; the same kind of call lost on every seed
says what to work on. This reads one or more traces (one JSON line per ordinary signal
scored: gated's served p, the anchor's p, the TRUE label, the call and its history) and
counts, per group, the signals only gated got wrong and those only the anchor got wrong,
then lists the groups where gated loses most and where it wins most. A group is:

- the policy in force (v1 before `--switch-at`, v2 after; by the signal's seq),
- the TRUE category (``allow`` or the block rule),
- the tool, and for HTTP its method,
- where the call goes (gated/traffic/policy.py `destination_class`: org, allow-listed, outside),
- whether the session had read a file that holds credentials by convention
  (engine/known_names.py `sensitive_file`): the history rule's side of the call.

Found this way (docs/learning.md, "Org uploads after a secret read"): uploads to the org's
own hosts after a credential-file read, which the policy allows, were gated's largest
losing group on all six seeds.

    .venv/bin/python bench/trace_groups.py /tmp/trace_seed*.jsonl --switch-at 4000
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from gated.engine.known_names import sensitive_file  # noqa: E402
from gated.traffic import destination_class, parse_call  # noqa: E402

Group = tuple[str, str, str, str, str]


def after_credential_read(history: list[str] | None) -> bool:
    """Whether the session had read a file that holds credentials by convention
    (engine/known_names.py `sensitive_file`): what the pair term's history side marks."""
    return any(sensitive_file(parse_call(h)[1].get("path", ""))
               for h in history or [] if h.startswith("fs.read "))


def group_of(row: dict, switch_at: int) -> Group:
    """The group of one traced signal (see the module's docstring)."""
    tool, args = parse_call(row["context"])
    method = args.get("method")
    site = f"{tool} {method}" if isinstance(method, str) else tool
    return ("v1" if row["seq"] < switch_at else "v2", row["category"], site,
            destination_class(tool, args) or "-",
            "after a credential read" if after_credential_read(row.get("history")) else "-")


def disagreements(rows: Iterable[dict], switch_at: int) -> tuple[Counter, Counter, Counter]:
    """(signals per group, gated-only errors per group, anchor-only errors per group)."""
    seen, gated_only, anchor_only = Counter(), Counter(), Counter()
    for row in rows:
        key = group_of(row, switch_at)
        seen[key] += 1
        gated_wrong = (row["p"] >= 0.5) != row["true_allow"]
        anchor_wrong = (row["anchor_p"] >= 0.5) != row["true_allow"]
        gated_only[key] += gated_wrong and not anchor_wrong
        anchor_only[key] += anchor_wrong and not gated_wrong
    return seen, gated_only, anchor_only


def read_traces(paths: list[str]) -> Iterable[dict]:
    """Every scored signal of the traces (lines without a TRUE label are skipped)."""
    for path in paths:
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                if "true_allow" in row:
                    yield row


def table(groups: list[Group], seen: Counter, gated_only: Counter,
          anchor_only: Counter) -> list[str]:
    lines = ["| policy | TRUE category | tool | destination | history | signals | "
             "only gated wrong | only the anchor wrong |",
             "| --- | --- | --- | --- | --- | ---: | ---: | ---: |"]
    lines += [f"| {' | '.join(g)} | {seen[g]:,} | {gated_only[g]} | {anchor_only[g]} |"
              for g in groups]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", help="JSONL files written by bench_learning.py --trace")
    ap.add_argument("--switch-at", type=int, required=True,
                    help="the signal (seq) the policy changed at: bench_learning's --switch-at")
    ap.add_argument("--top", type=int, default=12, help="groups listed each way")
    a = ap.parse_args()
    seen, gated_only, anchor_only = disagreements(read_traces(a.traces), a.switch_at)
    margin = {g: gated_only[g] - anchor_only[g] for g in seen}
    print(f"{sum(seen.values()):,} signals from {len(a.traces)} trace(s): only gated wrong "
          f"{sum(gated_only.values())}, only the anchor wrong {sum(anchor_only.values())}\n")
    print("Where gated loses most:\n")
    losing = sorted((g for g in seen if margin[g] > 0), key=lambda g: -margin[g])[:a.top]
    print("\n".join(table(losing, seen, gated_only, anchor_only)))
    print("\nWhere gated wins most:\n")
    winning = sorted((g for g in seen if margin[g] < 0), key=lambda g: margin[g])[:a.top]
    print("\n".join(table(winning, seen, gated_only, anchor_only)))


if __name__ == "__main__":
    main()
