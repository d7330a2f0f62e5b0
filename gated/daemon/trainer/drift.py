"""What the trainer does when the drift detector raises an alarm and when the alarm's
verdict comes (gated.online.monitor decides both; the wide path's part is
wide_path.py `WidePath.on_drift` / `on_drift_verdict`).

It lives apart from loop.py because it is one concern -- a policy change: set aside the
replay examples the old policy labelled, empty the promotion slice, publish what the
wide path holds at the next chance, then keep or drop them by the verdict -- that the
training loop only calls into (`Trainer._score`, the resume's `apply_drift_verdicts`).
"""

from __future__ import annotations

import logging

log = logging.getLogger("gated.trainer")


class DriftResponse:
    """Mixin of `Trainer`: the response to drift alarms. Uses the trainer's
    `replay_floor` (set in `Trainer.__init__`), promotion gate, wide path, monitor, store,
    settings, events and `due_now` (publication.py)."""

    def _on_drift(self, began_seq: int, seen_seq: int) -> None:
        """A policy change (detected at signal `seen_seq`): stop replaying what the old
        policy labelled (set aside until the alarm's verdict, `_on_drift_verdict`), empty
        the promotion slice and hold nothing back for the next `promotion_holdout_after`
        signals, relax EWC and replay for `drift_adapt_signals` signals, tell the
        operator."""
        self.replay_floor = max(self.replay_floor, began_seq)
        self.promotion.forget(seen_seq)
        shrunk = self.wide_path.on_drift(began_seq, seen_seq)
        if self.wide_path.dirty:
            # what the wide path holds unpublished (its weights shrunk by the alarm, or
            # learned since the last swap) serves at the next chance, not a swap interval
            # later: the new policy's first signals are where it acts
            self.due_now()
        log.warning("drift: the serving model's error rate rose (Page-Hinkley); the change "
                    "began around signal %d. EWC off and replay at %.0f%% for the next %d "
                    "signals%s; the replay examples labelled before it are not replayed, and "
                    "are dropped unless the corrections of the next %d signals show the "
                    "rise was the gate's own mistakes", began_seq,
                    100 * self.settings.drift_replay_fraction,
                    self.settings.drift_adapt_signals,
                    self.wide_path.drift_note(shrunk), self.settings.drift_confirm_signals)
        self.events.on_drift(began_seq)

    def _set_aside(self, ex: dict) -> bool:
        """A replay example labelled before a drift alarm that waits for its verdict (a
        person's correction is never set aside: it is never dropped either)."""
        if self.replay_floor <= 0 or ex.get("locked"):
            return False
        seq = ex.get("seq")
        return seq is None or seq < self.replay_floor  # as the drop would decide

    def apply_drift_verdicts(self) -> None:
        """Act on the drift alarms the monitor has decided (also at a resume, where an
        alarm that was waiting stands)."""
        for began_seq, confirmed in self.monitor.take_verdicts():
            self._on_drift_verdict(began_seq, confirmed)

    def _on_drift_verdict(self, began_seq: int, confirmed: bool) -> None:
        """The alarm's verdict (`Monitor.take_verdicts`): a confirmed change drops the
        replay examples labelled before it (human corrections kept); a withdrawn alarm
        replays them again (the wide path's verdict: `WidePath.on_drift_verdict`)."""
        self.wide_path.on_drift_verdict(began_seq, confirmed)
        if not confirmed:
            self.replay_floor = 0
            log.info("drift alarm withdrawn: on the labels as corrected since, the error "
                     "rate did not rise (the gate's own mistakes, which people corrected); "
                     "the replay examples from before signal %d are kept and replayed "
                     "again, the wide path's weights as before it (what was learned since "
                     "kept), EWC and replay back to normal (the allow band's hold after the "
                     "alarm stays)", began_seq)
            self.events.on_drift_verdict(began_seq, False, 0)
            return
        dropped = self.store.reservoir_forget_before(began_seq)
        if not self.monitor.drift_pending:
            self.replay_floor = 0  # what it kept out is gone
        log.warning("drift confirmed (the labels that raised it stand after the corrections "
                    "since): dropped %d replay examples labelled before signal %d (human "
                    "corrections kept)", dropped, began_seq)
        self.events.on_drift_verdict(began_seq, True, dropped)
