"""The calibration map replayed over traces of `bench_learning.py --trace`: how often the
transformer gets a share of the served logit, under today's rule and under the rule before
it.

Today's rule (online/calibration.py `PlattCalibrator._earns_share`, since f433c0e): the
share leaves its prior (0 with a wide path) only where the fit with the share free beats
the fit with the share held at the prior on the newest quarter of the pairs by more than
`SHARE_EVIDENCE` standard errors of the paired per-pair log-loss gain. The rule before:
the free fit, whenever it beat the prior map. Each trace line is one ordinary signal as the
trainer scored it (its logit z, the transformer's part z_deep, the gate's decision, the
TRUE label); the replay feeds the calibrator what the daemon's monitor feeds it (the gate's
decision as the label, the early block weight, the monitor's window, burn-in and
intercept bound) and answers each signal with the map in force BEFORE that signal, as
serving does. It does not see the corrections (the trace holds ordinary signals only), so
its labels are noisier than the daemon's; both rules see the same ones.

    .venv/bin/python bench/calibration_replay.py /tmp/trace_seed*.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from gated.config.train import TrainConfig  # noqa: E402
from gated.daemon.trainer.wide_path import early_block_weight  # noqa: E402
from gated.online.calibration import PlattCalibrator  # noqa: E402
from gated.online.monitor import Monitor, MonitorSettings  # noqa: E402


@dataclass
class Replay:
    """One rule's replay of one trace."""
    calibrator: PlattCalibrator
    fits: int = 0
    shares: list[float] = field(default_factory=list)  # the share after each fit
    wrong: list[bool] = field(default_factory=list)  # the map's answer vs TRUE, per signal

    def step(self, z: float, z_deep: float, label: float, weight: float,
             true_allow: bool) -> None:
        p = float(self.calibrator(z, z_deep))
        self.wrong.append((p >= 0.5) != true_allow)
        if self.calibrator.update(z, label, None, z_deep, weight):
            self.fits += 1
            a, _, d = self.calibrator.params
            self.shares.append((a + d) / a)


def calibrator(free_share: bool) -> PlattCalibrator:
    """The calibrator the daemon's monitor builds for a gate with a wide path (the share's
    prior 0, as the trainer sets it); `free_share`: under the rule before f433c0e, the share
    fitted freely whenever the map is refitted."""
    cal = Monitor(MonitorSettings(transformer_share_prior=0.0)).calibrator
    if free_share:
        cal._earns_share = lambda *_: True
    return cal


def replay(path: str) -> tuple[Replay, Replay]:
    s = TrainConfig()
    today, before = Replay(calibrator(free_share=False)), Replay(calibrator(free_share=True))
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            label = 1.0 if r["decision"] == "allow" else 0.0
            w = early_block_weight(r["seq"], label, True, s.wide_early_block_weight,
                                   s.wide_early_block_signals)
            for rep in (today, before):
                rep.step(r["z"], r["z_deep"], label, w, bool(r["true_allow"]))
    return today, before


def summary(rep: Replay) -> str:
    shares = np.asarray(rep.shares) if rep.shares else np.zeros(1)
    return (f"{rep.fits} fits, share > 0 at {int(np.sum(shares > 1e-9))}, largest "
            f"{shares.max():.2f}, errors vs TRUE {sum(rep.wrong)} of {len(rep.wrong)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args()
    print("| trace | today's rule (the share earns its place) | the rule before (free share) "
          "| signals answered otherwise: today right / the rule before right |")
    print("| --- | --- | --- | --- |")
    for path in a.traces:
        today, before = replay(path)
        differ = [(t, b) for t, b in zip(today.wrong, before.wrong, strict=True) if t != b]
        print(f"| {Path(path).name} | {summary(today)} | {summary(before)} | "
              f"{sum(b for _, b in differ)} / {sum(t for t, _ in differ)} |")


if __name__ == "__main__":
    main()
