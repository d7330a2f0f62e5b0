"""The trainer's wide path replayed alone, deterministically, to one signal: what its probes say.

Why (docs/learning.md, "One wrong label in the window"): a probe miss in bench_learning.py
moves with the machine's timing (steps, publications, the alarm's signal), so one run says
little about why. This feeds the stream to the trainer's own code -- every signal through
`Trainer._take` (scored on the serving snapshot, learned by the wide path, the drift
detector and its response as in the daemon), a publication after each, no transformer step
(lr 0) -- so the same seed gives the same state every time, and at `--stop` scores the
probes of the policy in force with the trainer's own learner: the unseen-value probes by
TRUE category, the history-rule pairs, and each feature group's part of their logits
(bench/wide_parts.py `parts_table`) and the stream's errors (the served answer against
the TRUE label). `--at` prints the same at earlier signals too,
`--watch` every signal of those tools from the change on, `--set` overrides a [train]
setting. About six minutes to 4,200 signals on the sixty-fourth session's 2-core VM
(speed probe 148 GFLOP/s); ~58 minutes to 8,000, two at once, on the sixty-ninth's (66-87).

    .venv/bin/python bench/replay_parts.py --seed 15 --stop 4180 --at 4070,4150
    .venv/bin/python bench/replay_parts.py --seed 2 --stop 4194 --watch pkg.install \
        --set drift_wide_contra_decay_votes=1
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from bench.bench_learning import field_overrides  # noqa: E402
from bench.wide_parts import logit_parts, parts_table  # noqa: E402
from gated.config import TrainConfig  # noqa: E402
from gated.daemon.trainer import build_trainer  # noqa: E402
from gated.engine import ModelConfig  # noqa: E402
from gated.store import Store  # noqa: E402
from gated.traffic import GatewayTraffic  # noqa: E402


def _right(learner, cfg: ModelConfig, events) -> list[bool]:
    """Whether the learner's wide logit decides each event as its TRUE label says."""
    return [(logit_parts(learner, cfg, e.signal["context"], e.signal.get("history"))["z"]
             >= 0) == e.true_allow for e in events]


def history_report(learner, cfg: ModelConfig, probes) -> str:
    """The history pairs' accuracy, their allowed twins' apart, and the e-mail parts."""
    ok = _right(learner, cfg, probes)
    twins = [o for o, e in zip(ok, probes, strict=True) if e.true_allow]
    return (f"history-rule probes {np.mean(ok):.3f}, allowed twins {np.mean(twins):.3f}\n"
            + "\n".join(parts_table(learner, cfg, probes)))


def unseen_report(learner, cfg: ModelConfig, unseen, at: int, policy: str) -> str:
    """The unseen-value probes' accuracy, block recall on them and accuracy by TRUE
    category (`unseen`: made under the policy in force, whose TRUE labels they carry)."""
    by: dict[str, list[bool]] = collections.defaultdict(list)
    for ok, e in zip(_right(learner, cfg, unseen), unseen, strict=True):
        by[e.category].append(ok)
    blocks = [o for c, v in by.items() if c != "allow" for o in v]
    return (f"@{at} ({policy}): unseen-value probes "
            f"{np.mean([o for v in by.values() for o in v]):.3f}, block recall on them "
            f"{np.mean(blocks):.3f}; by TRUE category: "
            + ", ".join(f"{c} {np.mean(v):.2f}" for c, v in sorted(by.items())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--stop", type=int, default=4180, help="stream signals fed")
    ap.add_argument("--switch-at", type=int, default=4000)
    ap.add_argument("--probes", type=int, default=1000)
    ap.add_argument("--at", default="", help="comma-separated signals to report at too")
    ap.add_argument("--watch", default="", help="comma-separated tools to list after the change")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args()
    settings = dataclasses.replace(TrainConfig(), lr=0.0,
                                   **field_overrides(TrainConfig, a.set, "--set"))
    cfg = ModelConfig.preset("flint")
    at = {int(x) for x in a.at.split(",") if x}
    watch = set(filter(None, a.watch.split(",")))
    traffic, probe_traffic = GatewayTraffic(seed=a.seed), GatewayTraffic(seed=a.seed)
    with tempfile.TemporaryDirectory(prefix="gated-replay-parts-") as tmp:
        store = Store(tmp)
        trainer, _serving = build_trainer(store, cfg, settings, seed=a.seed, backend="numpy")
        errors = 0  # the served answers (p_allow >= 0.5) against the TRUE label
        for i in range(a.stop):
            if i in at:
                print(unseen_report(trainer.wide_path.learner, cfg,
                                    probe_traffic.probes(a.probes, a.seed + 1000), i,
                                    probe_traffic.policy)
                      + f"; the stream's errors so far {errors}", flush=True)
                print(f"@{i}: " + history_report(trainer.wide_path.learner, cfg,
                                                 probe_traffic.history_probes(
                                                     a.probes, a.seed + 1001)), flush=True)
            if i == a.switch_at:
                traffic.policy = probe_traffic.policy = "v2"
            ev = traffic.next()
            store.append_signals([ev.signal])
            trainer._take(store.read_signals(trainer.status.last_trained_seq, 16))
            for seq, p, *_ in trainer.take_scores():
                errors += (p >= 0.5) != ev.true_allow
                if i >= a.switch_at and ev.signal["context"].split(" ", 1)[0] in watch:
                    print(f"  signal {seq}: served p {p:.3f}, TRUE allow {ev.true_allow}, "
                          f"{ev.category}, gate {ev.signal.get('decision')}: "
                          f"{ev.signal['context'][:70]}", flush=True)
            trainer.publish_now()
        learner = trainer.wide_path.learner
        print(unseen_report(learner, cfg, probe_traffic.probes(a.probes, a.seed + 1000),
                            a.stop, probe_traffic.policy)
              + f"; the stream's errors {errors}")
        print(f"@{a.stop}: " + history_report(learner, cfg, probe_traffic.history_probes(
            a.probes, a.seed + 1001)))
        store.close()


if __name__ == "__main__":
    main()
