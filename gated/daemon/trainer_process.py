"""The trainer process: the online trainer, apart from the process that serves.

Why a process: a trainer thread beside the asyncio server shares its GIL, its BLAS thread
pool and (on a GPU) its stream, so a prediction waited for training (p99 140 ms on a
2-core CPU). Here the trainer has its own interpreter, its own BLAS threads and its own
CUDA context, and runs at a lower priority (`daemon.trainer_nice`).

It is started by the daemon's supervisor (supervisor.py) with the *spawn* method, so no
LMDB handle or CUDA context crosses from the parent: it opens the state dir itself.

Talking to the daemon, over two pipes the supervisor made:
- `wake` (daemon -> trainer): one small message after each group commit: "signals are in
  the log". The trainer reads the log itself (after its last trained sequence number);
  the pipe only ends its wait, so the trainer never polls.
- `conn` (both ways): the daemon sends ("settings", TrainConfig, RetentionConfig,
  bands.allow) on a config reload and ("stop",) at shutdown; the trainer sends every
  TrainerEvents hook as (name, payload, status) -- "swap" means a new version is
  published in LMDB, which the daemon then loads (LMDB MVCC: never a partial read).
  `status` is the trainer's status for the `status` op and the metrics.

The trainer stops on ("stop",), on SIGTERM/SIGINT (systemd signals the whole cgroup), and
when the daemon goes away (the pipe's EOF, and PR_SET_PDEATHSIG as a backstop): it skips
the transformer step in flight, checkpoints and exits 0. Killed instead, it loses nothing
acknowledged: the next start re-trains what came after the last checkpoint.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any

from ..config import RetentionConfig, TrainConfig
from .blas import limit_blas_threads

log = logging.getLogger("gated.trainer")

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class TrainerSpec:
    """What the trainer process needs to start (pickled to the spawned child)."""

    state_dir: str
    preset: str
    train: TrainConfig
    retention: RetentionConfig
    seed: int
    backend: str
    reinit: bool
    threads: int
    nice: int
    log_level: str
    #: `bands.allow`: where the allow band's guard counts a call in the band (a reload
    #: sends the new value with the settings)
    bands_allow: float = 0.9


def trainer_status(trainer: Any) -> dict[str, Any]:
    """The trainer's state as the `status` op and the metrics show it (plain values)."""
    t, w = trainer.status, trainer.window
    return {"step": t.step, "version": t.version, "last_trained_seq": t.last_trained_seq,
            "loss": dict(t.last_loss), "rollbacks": t.rollbacks, "swaps": t.swaps,
            "last_checkpoint": t.last_checkpoint, "scored": w.total_scored,
            "scored_reused": t.scored_reused, "scored_computed": t.scored_computed,
            "alignment": w.alignment, "window": len(w.items), "confusion": w.confusion(),
            "converged": trainer.converged(), "lr": trainer.opt.lr,
            "learning": trainer.monitor.stats(), "params": trainer.model.num_params,
            "on_gpu": trainer.on_gpu, "paused": trainer.paused,
            "promotion": None if trainer.promotion.last is None
            else trainer.promotion.last.as_dict()}


class PipeEvents:
    """TrainerEvents that travel to the daemon as (name, payload, status) messages."""

    def __init__(self, conn: Any) -> None:
        self.conn, self.trainer = conn, None
        self._lock = threading.Lock()

    def _send(self, name: str, payload: Any) -> None:
        status = trainer_status(self.trainer) if self.trainer is not None else None
        try:
            with self._lock:
                self.conn.send((name, payload, status))
        except (OSError, EOFError, ValueError):
            pass  # the daemon is gone; the trainer notices it on its control pipe

    def on_step(self, info: dict, seconds: float) -> None:
        keys = ("loss", "bce", "ce", "grad_norm", "lr")
        self._send("step", ({k: float(info[k]) for k in keys if info.get(k) is not None},
                            seconds))

    def on_scored(self, window: Any, converged: bool, stats: dict | None = None,
                  backpropagated: int = 0) -> None:
        self._send("scored", {"total_scored": window.total_scored,
                              "alignment": window.alignment, "window": len(window.items),
                              "confusion": window.confusion(), "converged": converged,
                              "stats": stats, "backpropagated": backpropagated,
                              "per_tool": None if self.trainer is None
                              else self.trainer.monitor.per_tool.stats()})

    def on_swap(self, version: int) -> None:
        cal = self.trainer.serving.calibration if self.trainer is not None else None
        self._send("swap", {"version": version,
                            "calibration": None if cal is None else (cal.a, cal.b, cal.d)})

    def on_rollback(self, reason: str) -> None:
        self._send("rollback", reason)

    def on_checkpoint(self, ts: float) -> None:
        self._send("checkpoint", ts)

    def on_gpu_fallback(self, reason: str) -> None:
        self._send("gpu_fallback", reason)

    def on_drift(self, began_seq: int) -> None:
        self._send("drift", began_seq)

    def on_drift_verdict(self, began_seq: int, confirmed: bool, dropped: int) -> None:
        self._send("drift_verdict", (began_seq, confirmed, dropped))

    def on_promotion(self, decision: dict) -> None:
        self._send("promotion", decision)

    def on_operator_rollback(self, result: dict) -> None:
        self._send("operator_rollback", result)


def _die_with_parent() -> None:
    """Ask Linux to send SIGTERM when the daemon dies (kill -9 included)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the control pipe's EOF still stops the trainer


def _listen(trainer: Any, conn: Any, wake: Any) -> None:
    """Control messages and wakes from the daemon, until it goes away."""

    def wakes() -> None:
        try:
            while True:
                wake.recv_bytes()
                trainer.wake()
        except (EOFError, OSError):
            trainer.stop(drain=False)

    threading.Thread(target=wakes, name="gated-trainer-wake", daemon=True).start()
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "settings":
                trainer.retention = msg[2]
                trainer.update_settings(msg[1], bands_allow=msg[3])
            elif msg[0] == "stop":
                trainer.stop(drain=False)
            elif msg[0] == "rollback":
                trainer.request_rollback(msg[1], msg[2])
            elif msg[0] == "resume":
                trainer.resume()
    except (EOFError, OSError):
        log.warning("the daemon went away: checkpointing and stopping")
        trainer.stop(drain=False)


def _rehearse(model_cfg: Any, settings: Any, backend: str) -> None:
    """Compile what the trainer's first signals would (trainer/rehearsal.py), so that they
    are not scored by a stale snapshot for seconds. A failure is logged, not fatal: the
    real trainer's GPU errors have their own fallback (trainer/gpu.py)."""
    from .trainer.rehearsal import rehearse

    try:
        done = rehearse(model_cfg, settings, backend)
    except Exception as e:  # noqa: BLE001 - the trainer starts anyway
        log.warning("the trainer's rehearsal on the GPU failed (%s: %s); starting anyway: "
                    "its first signals may wait for kernel compilation", type(e).__name__, e)
        return
    log.info("trainer rehearsal on the GPU: %d steps, %d swaps in %.1f s on throwaway state "
             "(kernels compiled before the first real signal)", done["steps"], done["swaps"],
             done["seconds"])


def run_trainer(spec: TrainerSpec, conn: Any, wake: Any) -> None:
    """The trainer process's main function (the target of the spawned Process)."""
    _die_with_parent()
    if os.getppid() == 1:
        sys.exit(0)  # the daemon died before PDEATHSIG was set
    logging.basicConfig(level=spec.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s[trainer]: %(message)s")
    blas = limit_blas_threads(spec.threads)
    log.info("trainer process: BLAS at %s thread(s) of %d cores", blas or "no library,",
             os.cpu_count() or 1)
    if spec.nice:
        try:
            os.nice(spec.nice)
        except OSError as e:
            log.warning("could not lower the trainer's priority (%s)", e)

    from ..engine import ModelConfig
    from ..store import Store
    from .serving import Bands
    from .trainer import GPU_BACKENDS, build_trainer

    if spec.backend in GPU_BACKENDS:
        _rehearse(ModelConfig.preset(spec.preset), spec.train, spec.backend)
    store = Store(spec.state_dir, replay_slots=spec.train.replay_slots)
    events = PipeEvents(conn)
    trainer, _ = build_trainer(store, ModelConfig.preset(spec.preset), spec.train,
                               seed=spec.seed, backend=spec.backend, events=events,
                               reinit=spec.reinit, serving_bands=Bands(allow=spec.bands_allow))
    trainer.retention = spec.retention
    trainer.use_cores(spec.threads)
    events.trainer = trainer

    # The handler only writes the signal's number to a pipe; a thread reads it and stops
    # the trainer. Why: a Python handler runs in the main thread between two bytecodes,
    # possibly while that thread holds the trainer's wake Event's lock (the loop waits on
    # it), and `trainer.stop` sets that Event: the lock is not reentrant, so the stop
    # can deadlock -- the likely cause of a trainer that logged the SIGTERM, never stopped,
    # and was killed by the supervisor after 4 s (1 of 12 stops in one CI run of
    # tests/test_trainer_process.py, 2026-12-07; not reproduced in 60 more).
    signal_r, signal_w = os.pipe()

    def on_signal(signum: int, _frame: object) -> None:
        os.write(signal_w, bytes([signum]))

    def stop_on_signal() -> None:
        signum = os.read(signal_r, 1)[0]
        log.info("trainer: %s, checkpointing and stopping", signal.Signals(signum).name)
        trainer.stop(drain=False)

    threading.Thread(target=stop_on_signal, name="gated-trainer-signal", daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    if spec.reinit or store.published_info() is None:
        trainer.publish_now()  # what the daemon serves is what the trainer scores with
    trainer.report_alignment()
    threading.Thread(target=_listen, args=(trainer, conn, wake), name="gated-trainer-ctl",
                     daemon=True).start()
    log.info("trainer process %d: step %d, version %d, resuming after signal %d",
             os.getpid(), trainer.status.step, trainer.status.version,
             trainer.status.last_trained_seq)
    try:
        trainer.run()  # the loop, in this (main) thread; checkpoints on the way out
    finally:
        store.close()
        # Stopped and checkpointed: a late SIGTERM (systemd signals the whole cgroup, an
        # operator's second Ctrl-C) must not turn this clean exit into -SIGTERM. Python's
        # shutdown puts its own handlers back to SIG_DFL but leaves SIG_IGN alone, and a
        # hung exit is still SIGKILLed by the supervisor and by systemd.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
