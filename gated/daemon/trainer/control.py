"""What other threads ask of the trainer: wake up, stop, take a reloaded config, roll back
to a kept version or pause, resume; and how the training loop applies them.

It lives apart from loop.py because these are the trainer's controls, called from the
daemon's side (or a benchmark), while loop.py is what the trainer thread itself does.
"""

from __future__ import annotations

import logging
import time

from ...config import TrainConfig

log = logging.getLogger("gated.trainer")


class Control:
    """Mixin of `Trainer`: its controls. Uses the trainer's `_wake`, `_stop_event`,
    `_drain_deadline`, `_settings_lock`, `_pending_settings`, `_pending_rollback` and
    `paused` (set in `Trainer.__init__`), and its model, AdamW, wide path, promotion gate,
    monitor, store, status, events and `publish_now` (publication.py)."""

    # --- control from other threads --------------------------------------------------------
    def wake(self) -> None:
        """Called after a commit: new signals are in the log."""
        self._wake.set()

    def stop(self, drain: bool = True, timeout: float = 30.0) -> None:
        """Ask the thread to finish: train what is queued (for at most `timeout` seconds
        when draining) and checkpoint. Signals left untrained stay in the log and are
        trained after the restart."""
        self._drain_deadline = time.monotonic() + (timeout if drain else 0.0)
        self._stop_event.set()
        self._wake.set()

    def update_settings(self, settings: TrainConfig, bands_allow: float) -> None:
        """Hot reload: applied by the trainer thread at its next step boundary. The allow
        band's guard then watches the calls from `bands_allow` (the reloaded `bands.allow`)
        on, as serving answers them (`Monitor.watch_allow_band`)."""
        with self._settings_lock:
            self._pending_settings = (settings, bands_allow)
        self._wake.set()

    def request_rollback(self, version: int, pause: bool) -> None:
        """An operator's `gated rollback`: applied by the training loop at its next
        iteration (`_apply_rollback`)."""
        with self._settings_lock:
            self._pending_rollback = (version, pause)
        self._wake.set()

    def resume(self) -> None:
        """Train again after `rollback --pause`."""
        if self.paused:
            log.warning("training resumed by the operator")
        self.paused = False
        self._wake.set()

    def _apply_rollback(self, version: int, pause: bool) -> None:
        """Train on from the weights of kept published `version`, and publish them as the
        next version (one LMDB transaction: serving never sees a mix). AdamW's first
        moments restart (they belong to the abandoned trajectory); its second moments and
        the wide path's AdaGrad sums are kept."""
        flat = self.store.load_published_version(version)
        if flat is None or flat.size != self.model.num_params:
            log.error("rollback to version %d refused: it is not among the kept published "
                      "versions (gated inspect lists them)", version)
            self.events.on_operator_rollback({"to": version, "ok": False})
            return
        xp = self.model.ops.xp
        self.model.flat[...] = xp.asarray(flat)
        self.opt.m[...] = 0
        self._deep_version += 1
        self.paused = pause
        self.publish_now()
        log.warning("rolled back by the operator to version %d, published as version %d; "
                    "training %s", version, self.status.version,
                    "paused until `gated resume`" if pause else "continues from it")
        self.events.on_operator_rollback({"to": version, "ok": True,
                                          "version": self.status.version, "paused": pause})

    def apply_settings(self, s: TrainConfig) -> None:
        self.settings = s
        self.model.lambda_bce, self.model.lambda_ce = s.lambda_bce, s.lambda_ce
        self.model.ewc.lam = s.lambda_ewc
        self.opt.lr = s.lr
        self.wide_path.apply_settings(s)
        if hasattr(self, "promotion"):
            self.promotion.margin = s.promotion_margin
        if hasattr(self, "monitor"):
            self.monitor.update_settings(drift_adapt_signals=s.drift_adapt_signals,
                                         drift_confirm_signals=s.drift_confirm_signals,
                                         drift_withdraw_below=s.drift_withdraw_below,
                                         drift_confirm_waits=s.drift_confirm_waits)
        self.opt.weight_decay, self.opt.clip_norm = s.weight_decay, s.clip_norm
        self.opt.schedule.warmup_steps, self.opt.schedule.cosine_steps = (s.warmup_steps,
                                                                          s.cosine_steps)
