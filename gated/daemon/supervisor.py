"""The trainer's supervisor, in the daemon process: starts the trainer process, relays its
messages, restarts it when it dies, and stops it within a deadline.

One thread owns the child: it waits on the child's pipe and its process sentinel at once
(no polling), hands each message to `on_message`, and when the child exits unasked, logs
it, counts it (`gated_trainer_restarts_total`) and starts a new one after a backoff
(1 s doubling to 30 s; back to 1 s once a child has lived a minute). Serving never
waits for any of this: it keeps the last published weights.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import wait
from typing import Any

from ..config import RetentionConfig, TrainConfig
from .trainer_process import TrainerSpec, run_trainer

log = logging.getLogger("gated.supervisor")

BACKOFF_FIRST_S, BACKOFF_MAX_S, HEALTHY_AFTER_S = 1.0, 30.0, 60.0


class TrainerSupervisor:
    """The trainer process's life cycle. `status` is its newest reported status (None
    until it has reported)."""

    def __init__(self, spec: TrainerSpec, on_message: Callable[[str, Any], None],
                 on_restart: Callable[[], None] = lambda: None) -> None:
        self.spec = spec
        self.on_message, self.on_restart = on_message, on_restart
        self.status: dict[str, Any] | None = None
        self.restarts = 0
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self._wake: Any = None
        self._send_lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="gated-supervisor",
                                        daemon=True)

    # --- from the daemon -----------------------------------------------------------------
    def start(self) -> None:
        self._spawn()
        self._thread.start()

    def wake(self) -> None:
        """New signals are in the log. Never blocks: a full pipe already holds wakes."""
        w = self._wake
        if w is None:
            return
        try:
            w.send_bytes(b"w")
        except (BlockingIOError, OSError, ValueError):
            pass

    def update(self, train: TrainConfig, retention: RetentionConfig,
               bands_allow: float) -> None:
        """A config reload: the running trainer applies it at its next step, and a
        restarted one starts with it. `bands_allow` (the reloaded `bands.allow`) moves the
        allow band's guard to the band serving now answers."""
        self.spec = replace(self.spec, train=train, retention=retention,
                            bands_allow=bands_allow)
        self._send(("settings", train, retention, bands_allow))

    def rollback(self, version: int, pause: bool) -> None:
        """An operator's rollback, applied by the trainer at its next iteration."""
        self._send(("rollback", version, pause))

    def resume(self) -> None:
        self._send(("resume",))

    def alive(self) -> bool:
        """Whether the trainer process is running, read from its sentinel without reaping
        it: `is_alive` would waitpid from the caller's thread (the status op, the metrics),
        and the supervising thread must stay the child's only reaper (see `stop`)."""
        proc = self._proc
        return proc is not None and not wait([proc.sentinel], 0)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def stop(self, timeout: float) -> int | None:
        """Ask the trainer to checkpoint and exit; kill it after `timeout` seconds.
        Returns its exit code (None if none ran)."""
        self._stopping.set()
        self._send(("stop",))
        proc = self._proc
        if proc is None:
            return None
        # The supervising thread reaps the child (`_relay` joins it once its sentinel is
        # ready; `alive` only reads the sentinel), so wait for that thread, not for the
        # process: two threads waiting on one child race for it, and the one that loses
        # sees "no such child", which `is_alive` reports as still running -- a clean exit
        # (systemd signals the trainer too, so it may exit first) was logged as a hang and
        # killed.
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the trainer did not stop within %.1fs; killing it (every "
                        "acknowledged signal is in the log; the next start re-trains what "
                        "came after its last checkpoint)", timeout)
            proc = self._proc  # a restart may have been under way when the stop came
            proc.kill()
            self._thread.join(5.0)
        return proc.exitcode

    # --- the supervising thread ----------------------------------------------------------
    def _send(self, msg: tuple) -> None:
        with self._send_lock:
            conn = self._conn
            if conn is None:
                return
            try:
                conn.send(msg)
            except (OSError, ValueError):
                pass  # the child is gone; the supervising thread restarts it

    def _spawn(self) -> None:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        wake_r, wake_w = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(target=run_trainer, args=(self.spec, child_conn, wake_r),
                                 name="gated-trainer", daemon=True)
        proc.start()
        child_conn.close()
        wake_r.close()
        os.set_blocking(wake_w.fileno(), False)
        with self._send_lock:
            self._proc, self._conn, self._wake = proc, parent_conn, wake_w
        self.spec = replace(self.spec, reinit=False)  # a restart resumes, never reinits
        log.info("trainer process started (pid %d)", proc.pid)

    def _supervise(self) -> None:
        backoff = BACKOFF_FIRST_S
        while True:
            proc, conn = self._proc, self._conn
            started = time.monotonic()
            self._relay(proc, conn)
            code = proc.exitcode
            if self._stopping.is_set():
                return
            lived = time.monotonic() - started
            if lived >= HEALTHY_AFTER_S:
                backoff = BACKOFF_FIRST_S
            self.restarts += 1
            log.error("the trainer process (pid %d) exited with %s after %.0fs; serving "
                      "goes on with version %s; restarting it in %.0fs (restart %d)",
                      proc.pid, code, lived,
                      (self.status or {}).get("version", "?"), backoff, self.restarts)
            self.on_restart()
            if self._stopping.wait(backoff):
                return
            backoff = min(BACKOFF_MAX_S, backoff * 2)
            try:
                self._spawn()
            except OSError as e:
                log.error("starting the trainer process failed (%s); retrying", e)

    def _handle(self, msg: tuple) -> None:
        """One (name, payload, status) message of the trainer."""
        name, payload, status = msg
        if status is not None:
            self.status = status
        try:
            self.on_message(name, payload)
        except Exception:  # noqa: BLE001 - a bad message never stops supervision
            log.exception("handling the trainer's %r message failed", name)

    def _relay(self, proc: Any, conn: Any) -> None:
        """Messages from the child until it exits."""
        open_conn = True
        while True:
            ready = wait([proc.sentinel, conn] if open_conn else [proc.sentinel])
            if conn in ready:
                try:
                    self._handle(conn.recv())
                except (EOFError, OSError):
                    open_conn = False
                continue
            if proc.sentinel in ready:
                proc.join()
                # drain what the child sent before it exited
                while open_conn:
                    try:
                        if not conn.poll():
                            break
                        self._handle(conn.recv())
                    except (EOFError, OSError):
                        break
                conn.close()
                return
