"""What progressive validation feeds, in one place: alignment (vs the gate and vs the
corrected labels), calibration quality, Platt fitting and drift detection.

The trainer scores every fresh signal with the serving snapshot before training on it and
hands each (signal, logit, calibrated p) here; this object answers "how good is the gate
now", "did the policy change" and "what calibration should serving use".
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from ..signals import CORRECTIONS
from .calibration import PlattCalibrator, brier_score, expected_calibration_error
from .drift import CheckedTest, PageHinkley
from .per_tool import PerTool
from .progressive import AlignmentWindow, CorrectedAlignment

log = logging.getLogger("gated.trainer")


@dataclass(frozen=True)
class MonitorSettings:
    window: int = 1000
    calibration_window: int = 2000
    #: the first pairs of a fresh state, which the calibration map never sees (scored by a
    #: model that had barely begun: online/calibration.py `PlattCalibrator`)
    calibration_burn_in: int = 500
    #: the largest intercept the calibration map may serve (online/calibration.py
    #: `PlattCalibrator`): 0, it never moves a decision towards "allow"; inf: unbounded
    calibration_intercept_max: float = 0.0
    drift_delta: float = 0.01
    drift_threshold: float = 12.0
    drift_min_samples: int = 200
    drift_adapt_signals: int = 1000
    #: a drift alarm waits this many observations for the corrections of the labels that
    #: raised it, then is confirmed or withdrawn (drift.py `CheckedTest`); 0: confirmed at
    #: once
    drift_confirm_signals: int = 50
    #: ... and is withdrawn at once only when the rerun on corrected labels stays at or
    #: under this share of the threshold; between it and the threshold it waits again, at
    #: most `drift_confirm_waits` waits in all, the threshold deciding at the last
    #: (drift.py `CheckedTest`; 1.0 or 1: one wait; docs/learning.md "A drift verdict with
    #: a margin")
    drift_withdraw_below: float = 0.5
    drift_confirm_waits: int = 2
    #: the allow band stays closed (would-be allows answered `ask`) until progressive
    #: validation has scored this many fresh signals: a fresh model's confident allows
    #: are untested (`Monitor.allow_band_open`)
    allow_band_after: int = 500
    #: ... and for this many scored signals after a detected policy change
    allow_band_drift_hold: int = 300
    #: p_allow from which a call is in the allow band (`bands.allow`; a reload of it reaches
    #: the guard through `Monitor.watch_allow_band`)
    allow_band_p: float = 0.9
    #: the allow band's own guard: Page-Hinkley on "the gate said block" among the calls
    #: in the allow band (docs/learning.md "The allow band waits for evidence")
    allow_guard_delta: float = 0.05
    allow_guard_threshold: float = 5.0
    allow_guard_min_samples: int = 50
    #: the transformer's share of the served logit before a calibration fit gives it one
    #: (online/calibration.py): 0 when a wide path decides alone at first
    transformer_share_prior: float = 1.0


class Monitor:
    """Progressive-validation state; `observe` once per scored fresh signal."""

    def __init__(self, s: MonitorSettings | None = None) -> None:
        s = s or MonitorSettings()
        self.settings = s
        self.window = AlignmentWindow(s.window)
        self.corrected = CorrectedAlignment(s.window)
        self.calibrator = PlattCalibrator(size=s.calibration_window,
                                          share_prior=s.transformer_share_prior,
                                          burn_in=s.calibration_burn_in,
                                          intercept_max=s.calibration_intercept_max)
        self.drift = PageHinkley(s.drift_delta, s.drift_threshold, s.drift_min_samples)
        self.allow_guard = PageHinkley(s.allow_guard_delta, s.allow_guard_threshold,
                                       s.allow_guard_min_samples, memory=200)
        # the drift alarms wait for the corrections of the labels that raised them
        self.drift_check = CheckedTest(self.drift, s.drift_confirm_signals,
                                       s.drift_withdraw_below, s.drift_confirm_waits)
        self.per_tool = PerTool()
        self._recent: deque[tuple[float, float]] = deque(maxlen=s.window)  # (p_cal, label)
        #: (began seq, confirmed) of the drift alarms decided, for the trainer
        self._verdicts: deque[tuple[int, bool]] = deque()
        self.adapt_until = 0  # total_scored at which adaptation after a drift ends
        self.allow_hold_until = 0  # total_scored at which the allow band reopens
        self.last_drift_seq: int | None = None

    def update_settings(self, **changes: float) -> None:
        """Reloaded settings (`MonitorSettings` fields); the alarms' wait follows."""
        self.settings = replace(self.settings, **changes)
        self.drift_check.wait = self.settings.drift_confirm_signals
        self.drift_check.withdraw_below = self.settings.drift_withdraw_below
        self.drift_check.max_waits = self.settings.drift_confirm_waits

    def observe(self, seq: int, fingerprint: bytes, feedback: str | None, label: float,
                z: float, p: float, tool: str | None = None, z_deep: float = 0.0,
                block_weight: float = 1.0) -> int | None:
        """Record one scored signal (of `tool`, for the per-tool view; `block_weight`: its
        calibration pair's weight while labelled "block", `PlattCalibrator.update`).
        Returns the sequence number where a policy change began when this observation
        raises a drift alarm, else None (the alarm's verdict comes later:
        `take_verdicts`)."""
        self.window.add(p, label)
        if tool is not None:
            self.per_tool.observe(tool, p, label)
        correction = feedback in CORRECTIONS
        if correction:
            self.corrected.correct(fingerprint, label)
            self.calibrator.relabel(fingerprint, label)
        else:
            self.corrected.add(fingerprint, p, label)
        self._recent.append((p, label))
        self.calibrator.update(z, label, fingerprint, z_deep, block_weight)
        if p >= self.settings.allow_band_p:
            self._guard_allow_band(label)
        began = self.drift_check.observe(seq, fingerprint, p < 0.5, label < 0.5, correction)
        now = self.window.total_scored
        if began is not None:
            self.adapt_until = now + self.settings.drift_adapt_signals
            self._hold_allow_band()
            self.last_drift_seq = began
        for began_seq, confirmed in self.drift_check.take_verdicts():
            self._verdicts.append((began_seq, confirmed))
            if not confirmed:  # the gate's own mistakes, corrected since (the trainer logs)
                # Adaptation ends; the allow band's hold does not: `ask` is the cautious
                # answer, and a withdrawal can be wrong (docs/learning.md "A drift alarm
                # waits for corrections").
                self.adapt_until = min(self.adapt_until, now)
        return began

    def take_verdicts(self) -> list[tuple[int, bool]]:
        """(began seq, confirmed) of each drift alarm decided since the last call, oldest
        first: the trainer drops the replay before a confirmed change, keeps it for a
        withdrawn one."""
        out = list(self._verdicts)
        self._verdicts.clear()
        return out

    @property
    def drift_pending(self) -> bool:
        """A drift alarm is waiting for corrections (its replay set aside meanwhile)."""
        return self.drift_check.pending

    @property
    def adapting(self) -> bool:
        """True for `drift_adapt_signals` signals after a detected drift."""
        return self.window.total_scored < self.adapt_until

    def _guard_allow_band(self, label: float) -> None:
        """One call in the allow band: did the gate say block? A rise of that rate (a
        policy change that blocks what used to pass, seen by the gate first) closes the
        allow band for `allow_band_drift_hold` signals. The error-stream detector above
        sees it too, but later: it watches every call, and its alarm came after most of
        the wrong allows (docs/learning.md). Its alarms do not wait for corrections: a
        withdrawn one reopened the band on a policy change (docs/learning.md "A drift
        alarm waits for corrections")."""
        if self.allow_guard.update(float(label < 0.5)) is not None:
            self._hold_allow_band()
            log.warning("allow band closed for the next %d signals: the gate blocked more of "
                        "the calls gated would allow than before (allow-band guard, "
                        "Page-Hinkley); those are answered 'ask' meanwhile, nothing is lost",
                        self.settings.allow_band_drift_hold)

    def watch_allow_band(self, allow_band_p: float) -> None:
        """`bands.allow` was reloaded: the guard watches the calls from `allow_band_p` on.
        Its Page-Hinkley test starts over, because the rate it learned ("the gate said
        block" among the old band's calls) is not the new band's: a wider band holds more
        doubtful calls, and comparing them with the old baseline would be a false alarm
        (the band closed for `allow_band_drift_hold` signals for nothing). A hold in force
        is kept."""
        if allow_band_p == self.settings.allow_band_p:
            return
        log.info("the allow band's guard now watches calls with p_allow >= %.3g (was %.3g; "
                 "bands.allow reloaded); its test starts over", allow_band_p,
                 self.settings.allow_band_p)
        self.settings = replace(self.settings, allow_band_p=allow_band_p)
        self.allow_guard.reset()

    def _hold_allow_band(self) -> None:
        """Close the allow band for the next `allow_band_drift_hold` scored signals (an
        alarm during a hold extends it, never shortens it)."""
        self.allow_hold_until = max(self.allow_hold_until, self.window.total_scored
                                    + self.settings.allow_band_drift_hold)

    @property
    def allow_band_open(self) -> bool:
        """May serving answer `allow` at all? Not before progressive validation has scored
        `allow_band_after` fresh signals (counted by the calibrator, which keeps its count
        across restarts), nor for `allow_band_drift_hold` signals after a drift alarm or an
        alarm of the allow band's own guard (`_guard_allow_band`), withdrawn or not. Why
        (measured, docs/learning.md "The allow band waits for evidence"): in its first 500
        signals flint put 9-18 calls the TRUE policy blocks in the allow band (ten CPU
        runs; p 0.90-0.999, a credential read at signal 33 with p 0.991), the allow band's
        precision there ~0.96 against >= 0.9995 outside the first 500 and the 500 after a
        policy change. Closed, those calls are answered `ask`; p_allow is unchanged."""
        if not self.warm:
            return False
        return self.window.total_scored >= self.allow_hold_until

    @property
    def warm(self) -> bool:
        """Has progressive validation scored `allow_band_after` fresh signals (counted by
        the calibrator, across restarts)? Before that the state has learned too little
        for its answers to be trusted: the allow band is closed, and the trainer
        publishes at its ordinary cadence only (publication.py `publish_soon`)."""
        return self.calibrator.seen >= self.settings.allow_band_after

    def stats(self) -> dict[str, float]:
        p = np.array([a for a, _ in self._recent])
        y = np.array([b for _, b in self._recent])
        return {"alignment": self.window.alignment,
                "alignment_corrected": self.corrected.alignment,
                "ece": expected_calibration_error(p, y), "brier": brier_score(p, y),
                "calibration_a": self.calibrator.a, "calibration_b": self.calibrator.b,
                "calibration_d": self.calibrator.d,
                "drift_detections": float(self.drift.detections),
                "drift_withdrawn": float(self.drift_check.withdrawn),
                "drift_pending": float(self.drift_pending),
                "adapting": float(self.adapting),
                "allow_band_open": float(self.allow_band_open),
                "allow_guard_alarms": float(self.allow_guard.detections),
                "allow_guard_band": self.settings.allow_band_p}

    def state(self) -> dict:
        now = self.window.total_scored
        return {"corrected": self.corrected.dump(), "calibrator": self.calibrator.state(),
                "drift": self.drift.state(), "allow_guard": self.allow_guard.state(),
                "drift_check": self.drift_check.state(),
                "recent": [list(r) for r in self._recent],
                "per_tool": self.per_tool.state(),
                "adapt_left": max(0, self.adapt_until - now),
                "allow_hold_left": max(0, self.allow_hold_until - now)}

    def load(self, state: dict | None) -> None:
        if not state:
            return
        self.corrected.load(state.get("corrected", []))
        self.calibrator.load(state.get("calibrator"))
        self.drift.load(state.get("drift"))
        self.allow_guard.load(state.get("allow_guard"))
        self.per_tool.load(state.get("per_tool"))
        self._recent.extend(tuple(r) for r in state.get("recent", []))
        now = self.window.total_scored
        self.adapt_until = now + int(state.get("adapt_left", 0))
        self.allow_hold_until = now + int(state.get("allow_hold_left", 0))
        # the run's observations are not checkpointed: an alarm that waited stands
        self.drift_check.load(state.get("drift_check"))
        self._verdicts.extend(self.drift_check.take_verdicts())
