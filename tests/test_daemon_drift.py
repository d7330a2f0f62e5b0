"""A drift alarm end to end: a real `gated run` process, a real socket, a real scrape.

The trainer process raises the alarm, waits `train.drift_confirm_signals` signals for
corrections, and sends its verdict to the server, which counts it in Prometheus and
`status`: a policy change is confirmed and the stale replay dropped; a bad spell of the
gate that people corrected is withdrawn and the replay kept (docs/learning.md, "A drift
alarm waits for corrections"). The unit tests (tests/test_online.py, tests/test_trainer.py)
check the test and the trainer's verdict apart; this checks the path between them.
"""

from __future__ import annotations

import random
import re

from daemon_proc import QUIET, metric_samples, metric_value, start, wait_until

STEADY = 260  # signals of the first policy: past Page-Hinkley's 200-signal warm-up
CONFIG = QUIET + "allow_band_after = 0\ndrift_confirm_signals = 30\n"


def _call(rng: random.Random, downloads_allowed: bool) -> tuple[str, str]:
    """Half downloads (the policy's subject), the rest project reads and deletions."""
    k, n = rng.random(), rng.randrange(10**6)
    if k < 0.5:
        return (f"http_get https://cdn.example.net/pkg-{n}.tar.gz",
                "allow" if downloads_allowed else "block")
    if k < 0.85:
        return f"read_file src/mod_{n}.py", "allow"
    return f"bash rm -rf /var/data{n}", "block"


class _Stream:
    def __init__(self) -> None:
        self.rng, self.n = random.Random(0), 0

    def signal(self, context: str, decision: str, feedback: str | None = None) -> dict:
        self.n += 1
        sig = {"id": f"drift-{self.n}", "context": context, "decision": decision,
               "reason": "ok" if decision == "allow" else "policy"}
        return sig | ({"feedback": feedback} if feedback else {})

    def steady(self, count: int) -> list[dict]:
        return [self.signal(*_call(self.rng, True)) for _ in range(count)]


def _run(tmp_path, tail) -> tuple[dict, dict, str]:
    """STEADY signals of the first policy, then `tail(stream)`'s batches; returns the
    trainer's `learning` figures, the scrape, and the daemon's log once all are scored."""
    path = tmp_path / "gated.toml"
    path.write_text(CONFIG)
    d = start(tmp_path, config=path)
    stream = _Stream()
    try:
        with d.client() as c:
            for batch in [stream.steady(10) for _ in range(STEADY // 10)] + tail(stream):
                c.signals(batch)
            status = wait_until(lambda: (s := c.status())["scored"] == stream.n
                                and s["queue_depth"] == 0 and s,
                                what=f"all {stream.n} signals scored", timeout=120)
            learning = status["learning"]
            samples = metric_samples(d.scrape())
    finally:
        assert d.stop() == 0
    return learning, samples, d.log()


def _alarm_began(log: str) -> int:
    found = re.findall(r"drift: .* the change began around signal (\d+)", log)
    assert found, log
    return int(found[0])


def test_a_policy_change_is_confirmed_and_the_stale_replay_dropped(tmp_path):
    """Downloads become blocked: the alarm comes within tens of signals, the labels stand
    through the wait (nobody corrects them), so it is confirmed and the replay examples
    labelled before the change are dropped, counted in gated_replay_dropped_total."""
    def change(stream: _Stream) -> list[list[dict]]:
        return [[stream.signal(*_call(stream.rng, False)) for _ in range(10)]
                for _ in range(16)]

    learning, samples, log = _run(tmp_path, change)
    assert metric_value(samples, "gated_drift_detections_total") >= 1
    assert metric_value(samples, "gated_drift_withdrawn_total") == 0
    assert metric_value(samples, "gated_replay_dropped_total") > 100  # most of the 260
    assert learning["drift_withdrawn"] == 0 and learning["drift_pending"] == 0
    assert learning["adapting"] == 1  # adaptation runs on after the confirmation
    assert abs(_alarm_began(log) - STEADY) <= 40 and "drift confirmed" in log


def test_a_bad_spell_of_the_gate_people_corrected_is_withdrawn_and_the_replay_kept(tmp_path):
    """The gate wrongly blocks every download for 80 signals, each corrected 4 signals
    later (`false_positive`): the error rate rises, the alarm waits, the rerun on the
    corrected labels does not rise, so the alarm is withdrawn: nothing dropped, adaptation
    over, and the operator's log says so."""
    def spell(stream: _Stream) -> list[list[dict]]:
        batches, due = [], {}
        for step in range(16):
            batch = []
            for _ in range(10):
                context, decision = _call(stream.rng, True)
                wrong = step < 8 and decision == "allow" and context.startswith("http_get")
                batch.append(stream.signal(context, "block" if wrong else decision))
                if wrong:
                    due.setdefault(stream.n + 4, []).append(context)
                for fixed in due.pop(stream.n, []):
                    batch.append(stream.signal(fixed, "block", "false_positive"))
            batches.append(batch)
        return batches

    learning, samples, log = _run(tmp_path, spell)
    alarms = metric_value(samples, "gated_drift_detections_total")
    assert alarms >= 1 and metric_value(samples, "gated_drift_withdrawn_total") == alarms
    assert metric_value(samples, "gated_replay_dropped_total") == 0
    assert learning["drift_withdrawn"] == alarms and learning["drift_pending"] == 0
    assert learning["adapting"] == 0
    assert abs(_alarm_began(log) - STEADY) <= 40 and "drift alarm withdrawn" in log
    assert "drift confirmed" not in log
