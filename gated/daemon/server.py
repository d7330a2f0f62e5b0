"""`gated run`: the asyncio Unix-socket server, its op table (the handlers are in ops.py),
and the wiring of every part.

Two processes (docs/architecture.md):
- this one serves: the event loop (sockets, validation, replies; never blocks on LMDB or
  the model), the group-commit writer (the only writer of the signal log), the
  micro-batcher's thread (predict forwards on the immutable serving snapshot, one BLAS
  thread by default), a thread for explain, the trainer's supervisor, the config
  watcher and the metrics HTTP server;
- the trainer process (trainer_process.py, spawned and supervised by supervisor.py): the
  only writer of checkpoints, published snapshots, replay and the metrics history. It
  publishes each snapshot in LMDB and says so; this process loads it and swaps.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import signal
import socket
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .. import __version__
from ..config import Config, ConfigError, cli_overrides, load_config
from ..device import choose_backend, describe_preflight
from ..engine import Model, ModelConfig
from ..engine.layout import num_params, param_layout
from ..signals import WeightTable
from ..store import GroupCommitter, Store, StoreError
from ..store.disk import check_free_space, disk_free, human
from . import systemd
from .access import AccessPolicy
from .blas import limit_blas_threads
from .connections import Connections
from .metrics import Metrics
from .ops import OpHandlers
from .reload import ConfigWatcher, Reloader
from .serving import Bands, Calibration, MicroBatcher, Serving
from .supervisor import TrainerSupervisor
from .trainer_process import TrainerSpec
from .trust import Trust

log = logging.getLogger("gated")


def weight_table(cfg: Config) -> WeightTable:
    return WeightTable(confirm=cfg.weights.confirm, override=cfg.weights.override,
                       escalation=tuple(cfg.weights.fp_fn))


class Daemon(OpHandlers):
    def __init__(self, cfg: Config, *, config_path: str | None = None,
                 overrides: dict | None = None, reinit: bool = False) -> None:
        self.cfg = cfg
        self.config_path, self.overrides, self.reinit = config_path, overrides or {}, reinit
        self.metrics = Metrics()
        self.started = time.time()
        self._stop = asyncio.Event()
        self._explain_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gated-explain")
        self._draining = False
        #: The op table: every op the protocol knows, and the one method that answers it.
        self.ops = {"ping": self._op_ping, "status": self._op_status,
                    "predict": self._op_predict, "explain": self._op_explain,
                    "signal": self._op_signal, "signals": self._op_signals,
                    "rollback": self._op_rollback, "resume": self._op_resume}

    # --- the trainer's reports -------------------------------------------------------------
    def on_trainer_message(self, name: str, payload: Any) -> None:
        """A TrainerEvents hook from the trainer process (supervisor thread)."""
        m = self.metrics
        m.trainer_up.set(1)  # it speaks, so it runs
        if name == "swap":
            snap = self.serving.load_published(self.store)
            if snap is not None:
                m.swapped(snap.version)
                m.cache_entries.set(0)
        elif name == "step":
            m.observe_step(*payload)
        elif name == "scored":
            m.set_alignment(payload["alignment"], payload["window"], payload["confusion"],
                            payload["converged"], scored=self._new_scored(payload))
            if payload["stats"] is not None:
                m.set_learning(payload["stats"], payload["backpropagated"])
            if payload.get("per_tool"):
                m.set_per_tool(payload["per_tool"])
            t = self.supervisor.status or {}  # this message's status (supervisor._handle)
            scored = t.get("scored_reused", 0) + t.get("scored_computed", 0)
            if scored:
                m.scored_reused.set(t["scored_reused"] / scored)
        elif name == "drift":
            m.drifted()
        elif name == "drift_verdict":
            m.drift_verdict(payload[1], payload[2])
        elif name == "promotion":
            m.promotion(payload)
        elif name == "operator_rollback":
            m.operator_rollbacks.labels(result="done" if payload["ok"] else "refused").inc()
        elif name == "rollback":
            m.rolled_back()
        elif name == "checkpoint":
            m.checkpointed(payload)
        elif name == "gpu_fallback":
            m.gpu_fallback()
            m.set_backend("numpy", "cpu", f"switched from the GPU after repeated failures "
                          f"(last: {payload})")
            self.serving.move_to("numpy")

    def _new_scored(self, payload: dict) -> int:
        total = payload["total_scored"]
        new = max(0, total - self._scored_seen) if self._scored_seen is not None else 0
        self._scored_seen = total
        return new

    def on_trainer_restart(self) -> None:
        self.metrics.trainer_restarts.inc()
        self.metrics.trainer_up.set(0)
        self._scored_seen = None  # the new process counts from its checkpoint

    # --- status ----------------------------------------------------------------------------
    def _trainer(self) -> dict[str, Any]:
        """The trainer's newest report, or what the store says before it has reported."""
        t = self.supervisor.status
        if t is not None:
            return t
        info = self.store.checkpoint_info() or {}
        return {"step": info.get("step", 0), "last_trained_seq":
                info.get("last_trained_seq", 0), "scored": 0, "alignment": 0.0, "window": 0,
                "converged": False, "confusion": {}, "loss": {}, "lr": self.cfg.train.lr,
                "learning": {}, "rollbacks": 0, "swaps": 0, "last_checkpoint":
                info.get("saved_at", 0.0), "params": self.num_params, "on_gpu": False}

    def queue_depth(self, last_seq: int | None = None) -> int:
        """Signals acknowledged but not trained on yet."""
        last = self.store.last_seq() if last_seq is None else last_seq
        return max(0, last - self._trainer()["last_trained_seq"])

    def compute(self) -> tuple[str, str]:
        """(backend, device) now: the CPU once the trainer has fallen back from the GPU."""
        if self.backend != "numpy" and self.serving.backend == "numpy":
            return "numpy", "cpu"
        return self.backend, self.device

    def status(self) -> dict[str, Any]:
        t = self._trainer()
        last_seq = self.store.last_seq()
        backend, device = self.compute()
        cache = self.serving.cache
        return {
            "version": self.serving.current.version, "step": t["step"],
            "last_trained_seq": t["last_trained_seq"], "last_seq": last_seq,
            "queue_depth": max(0, last_seq - t["last_trained_seq"]),
            "scored": t["scored"], "alignment": t["alignment"], "window": t["window"],
            "converged": t["converged"], "confusion": t["confusion"], "loss": t["loss"],
            "lr": t["lr"], "learning": t["learning"], "rollbacks": t["rollbacks"],
            "swaps": t["swaps"], "last_checkpoint": t["last_checkpoint"],
            "promotion": t.get("promotion"), "paused": t.get("paused", False),
            "trainer": {"alive": self.supervisor.alive(), "pid": self.supervisor.pid,
                        "restarts": self.supervisor.restarts},
            "cache": {"entries": len(cache), "hits": cache.hits, "misses": cache.misses},
            # transformer logits serving remembered for the signals to come, and how many
            # fresh signals the trainer scored with them / ran the transformer for again
            "served_logits": {"remembered": len(self.serving.served),
                              "reused": t.get("scored_reused", 0),
                              "computed": t.get("scored_computed", 0)},
            # the band serving answers with: closed while the trainer's evidence does not
            # back an allow yet (train.allow_band_after, train.allow_band_drift_hold)
            "allow_band_open": bool(self.serving.calibration.allow_open),
            # the wide path's n-grams read by their familiarity (not while the trainer
            # adapts to a drift alarm: train.drift_wide_unscaled_examples)
            "wide_familiar": self._wide_familiar(),
            "backend": backend, "device": device, "preset": self.cfg.daemon.preset,
            "params": self.num_params, "uptime_s": time.time() - self.started,
            "gated_version": __version__, "config": self.cfg.to_dict()["train"],
            "trust": self.trust.status(),
        }

    # --- config reload ----------------------------------------------------------------------
    def apply_config(self, new: Config, keys: list[str]) -> None:
        """Apply hot-reloadable keys (called from the watcher thread or on SIGHUP)."""
        access = AccessPolicy.from_config(new.access)  # raises: the reload fails, nothing
        self.access = access                           # changes
        self.cfg = new
        logging.getLogger().setLevel(new.daemon.log_level)
        self.supervisor.update(new.train, new.retention, new.bands.allow)
        self.serving.bands = Bands(new.bands.allow, new.bands.block)
        self.committer.set_weights(weight_table(new))
        self.trust.apply_config(new)

    # --- start-up and shutdown -------------------------------------------------------------------
    def _listen_socket(self) -> socket.socket:
        fds = systemd.listen_fds()
        if fds:
            log.info("using the socket passed by systemd (LISTEN_FDS), fd %d", fds[0].fileno())
            for extra in fds[1:]:
                extra.close()
            fds[0].setblocking(False)
            return fds[0]
        path = Path(self.cfg.daemon.socket)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise RuntimeError(f"{path} exists and is not a socket; move it away or set "
                                   "--socket")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
                raise RuntimeError(f"another daemon is already listening on {path}")
            except (ConnectionRefusedError, FileNotFoundError):
                path.unlink()  # stale socket of a daemon that died
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        os.chmod(path, 0o660)
        sock.listen(256)
        sock.setblocking(False)
        log.info("listening on %s (mode 0660)", path)
        return sock

    def _initial_serving(self, model_cfg: ModelConfig) -> Serving:
        """What to serve before the trainer process reports: the published version (with
        its calibration), or -- fresh or --reinit -- the seed's initial weights, which are
        exactly what the trainer starts from and publishes."""
        cfg = self.cfg
        bands = Bands(cfg.bands.allow, cfg.bands.block)
        if not self.reinit:
            got = self.store.load_published_head()
            if got is not None and got[1].size == self.num_params:
                info = got[2]
                serving = Serving(model_cfg, got[1], got[0], int(info.get("step", 0)),
                                  backend=self.backend, bands=bands,
                                  cache_size=cfg.serving.cache_size, deep=info.get("deep"),
                                  served_size=cfg.serving.served_logits)
                if info.get("calibration"):
                    serving.calibration = Calibration(*info["calibration"])
                return serving
        init = Model.init(model_cfg, seed=cfg.daemon.seed)
        serving = Serving(model_cfg, init.ops.to_numpy(init.flat), 0, 0, backend=self.backend,
                          bands=bands, cache_size=cfg.serving.cache_size,
                          served_size=cfg.serving.served_logits)
        # nothing scored yet: no allow until the trainer's first publication says so
        serving.calibration = Calibration(allow_open=cfg.train.allow_band_after == 0)
        return serving

    # --- roles: what gated/cluster's EdgeDaemon and TrainerDaemon replace ------------------
    def _make_committer(self) -> Any:
        """Where acknowledged signals go: the LMDB group commit (an edge: JetStream)."""
        return GroupCommitter(self.store, weights=weight_table(self.cfg))

    def _make_supervisor(self) -> Any:
        """The trainer process's supervisor (an edge has no trainer)."""
        return TrainerSupervisor(self._trainer_spec(), self.on_trainer_message,
                                 self.on_trainer_restart)

    async def _start_role(self) -> None:
        """A cluster role's own tasks start here (after the trainer, before the socket)."""

    async def _stop_role(self) -> None:
        """... and stop here (after the last commit was flushed)."""

    def _trainer_spec(self) -> TrainerSpec:
        cfg = self.cfg
        threads = cfg.daemon.trainer_threads or max(1, (os.cpu_count() or 2)
                                                    - cfg.serving.threads)
        return TrainerSpec(state_dir=cfg.daemon.state_dir, preset=cfg.daemon.preset,
                           train=cfg.train, retention=cfg.retention, seed=cfg.daemon.seed,
                           backend=self.backend, reinit=self.reinit, threads=threads,
                           nice=cfg.daemon.trainer_nice, log_level=cfg.daemon.log_level,
                           bands_allow=cfg.bands.allow)

    async def run(self) -> int:
        faulthandler.enable()
        cfg = self.cfg
        try:
            self.access = AccessPolicy.from_config(cfg.access)
        except ValueError as e:
            raise RuntimeError(str(e)) from None
        logging.getLogger().setLevel(cfg.daemon.log_level)
        limit_blas_threads(cfg.serving.threads)
        model_cfg = ModelConfig.preset(cfg.daemon.preset)
        # The GPU preflight (memory check, kernel compile) runs before any weights exist.
        choice = choose_backend(cfg.daemon.device, model_cfg, cfg.train)
        self.backend, self.device = choice.backend, choice.device
        if choice.preflight is not None:
            pf = choice.preflight
            if not choice.fell_back:
                log.info("%s", describe_preflight(pf))
            self.metrics.set_device_memory(pf["total_bytes"], pf["free_bytes"],
                                           pf["estimate_bytes"], pf.get("reserved_bytes", 0))
        if choice.fell_back:
            self.metrics.gpu_fallback()
        log.log(logging.WARNING if choice.fell_back else logging.INFO,
                "compute backend %s on %s (%s)", self.backend, self.device, choice.reason)
        self.metrics.set_backend(self.backend, self.device, choice.reason)
        # A full disk is refused before anything is opened (docs/operations.md, "Full
        # disk"); the Store creates the state dir itself, mode 0750 (design.md, section 4).
        free = check_free_space(cfg.daemon.state_dir, cfg.daemon.disk_free_min_mib << 20)
        self._disk_low = False
        self._disk_warned_at = 0.0
        self._watch_disk(free)
        self.store = Store(cfg.daemon.state_dir, replay_slots=cfg.train.replay_slots)
        self.num_params = num_params(param_layout(model_cfg))
        self.serving = self._initial_serving(model_cfg)
        self.metrics.allow_band_open.set(float(bool(self.serving.calibration.allow_open)))
        self.metrics.wide_familiar.set(float(self._wide_familiar()))
        self.batcher = MicroBatcher(self.serving, cfg.serving.batch_wait_ms / 1000.0,
                                    cfg.serving.batch_max, on_batch=self._on_batch)
        self.metrics.weights_version.set(self.serving.current.version)
        self.committer = self._make_committer()
        self.trust = Trust(cfg, self.store, self.serving, self.batcher, self.metrics)
        self._scored_seen: int | None = None
        self.supervisor = self._make_supervisor()
        self.supervisor.start()
        await self._start_role()
        metrics_server = self.metrics.serve(cfg.daemon.metrics_addr) \
            if cfg.daemon.metrics_addr else None
        if metrics_server:
            log.info("metrics on %s", metrics_server.url)
        self.connections = Connections(cfg.limits, self.dispatch, self.metrics)
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(self.connections.protocol,
                                               sock=self._listen_socket())
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        reloader = Reloader(self.config_path, self.overrides, cfg, self.apply_config,
                            metrics=self.metrics)
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.run_in_executor(
            None, reloader.reload, "SIGHUP"))
        log.info("gated %s ready: preset %s (%d parameters), serving version %d, state %s; "
                 "trainer process %s", __version__, cfg.daemon.preset, self.num_params,
                 self.serving.current.version, cfg.daemon.state_dir, self.supervisor.pid)
        systemd.ready(self._status_line())
        # Started after READY=1: a reload sends RELOADING=1 ... READY=1 of its own.
        watcher = ConfigWatcher(self.config_path, lambda: reloader.reload("file change")) \
            if self.config_path else None
        if watcher:
            watcher.start()
        try:
            await self._supervise()
        finally:
            await self._shutdown(server, watcher, metrics_server)
        return 0

    def _on_batch(self, n: int) -> None:
        self.metrics.predict_batch.observe(n)

    def _wide_familiar(self) -> bool:
        """Whether serving now reads the wide path's n-grams scaled by their familiarity:
        the model has the scaling and the published calibration does not turn it off."""
        return (self.serving.cfg.wide_familiarity > 0 and self.serving.cfg.wide_buckets > 0
                and bool(self.serving.calibration.familiar))

    def _status_line(self) -> str:
        t = self._trainer()
        return (f"step {t['step']}, version {self.serving.current.version}, alignment "
                f"{t['alignment']:.3f} over {t['window']}, queue {self.queue_depth()}")

    async def _supervise(self) -> None:
        """Main loop: STATUS, WATCHDOG, queue depth, the trainer's liveness, and a swap
        the trainer's message may not have carried (a restart publishes before it
        reports)."""
        interval = systemd.watchdog_interval()
        tick = min(interval, 2.0) if interval else 2.0
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=tick)
            except TimeoutError:
                pass
            self.metrics.queue_depth.set(self.queue_depth())
            self.metrics.trainer_up.set(1 if self.supervisor.alive() else 0)
            self.metrics.cache_entries.set(len(self.serving.cache))
            self.metrics.wide_familiar.set(float(self._wide_familiar()))
            self.trust.tick()
            snap = await loop.run_in_executor(None, self.serving.load_published, self.store)
            if snap is not None:
                self.metrics.weights_version.set(snap.version)
            self._watch_disk(await loop.run_in_executor(None, disk_free,
                                                        self.cfg.daemon.state_dir))
            systemd.status(self._status_line())
            systemd.watchdog_ping()

    #: While the disk stays low, the warning is repeated this often (seconds).
    DISK_WARN_REPEAT_S = 900.0

    def _watch_disk(self, free: int | None) -> None:
        """gated_disk_free_bytes / gated_disk_low, and a WARNING when the state dir's
        filesystem runs low (once when it crosses, then every 15 minutes)."""
        if free is None:
            return
        self.metrics.disk_free.set(free)
        warn = self.cfg.daemon.disk_free_warn_mib << 20
        low = free < warn
        self.metrics.disk_low.set(1 if low else 0)
        now = time.monotonic()
        if low and (not self._disk_low or now - self._disk_warned_at >= self.DISK_WARN_REPEAT_S):
            log.warning("the filesystem holding the state %s has %s free, below "
                        "daemon.disk_free_warn_mib (%s): when it is full, signals are refused "
                        "with store_full (nothing acknowledged is lost) and the trainer pauses "
                        "until there is room; free space on it or move the state",
                        self.cfg.daemon.state_dir, human(free), human(warn))
            self._disk_warned_at = now
        elif not low and self._disk_low:
            log.info("the filesystem holding the state %s has %s free again (warning below "
                     "%s)", self.cfg.daemon.state_dir, human(free), human(warn))
        self._disk_low = low

    async def _shutdown(self, server, watcher, metrics_server) -> None:
        """SIGTERM: stop taking requests, flush the commits in flight (every acknowledged
        signal is durable), and give the trainer `daemon.stop_timeout_s` to checkpoint
        before it is killed. Whatever the backlog, this takes seconds: the trainer resumes
        from the log at the next start."""
        log.info("stopping: the trainer checkpoints; the queue stays in the log")
        systemd.stopping("stopping the trainer")
        self._draining = True
        server.close()
        # Every request already read gets its reply: a signal whose commit was submitted
        # its acknowledgement, a later one shutting_down (nothing more is read).
        cut = await self.connections.stop(self.cfg.daemon.stop_timeout_s)
        if cut:
            log.warning("%d connection(s) still busy after daemon.stop_timeout_s (%.1fs) "
                        "were cut: a signal of theirs left unanswered may have been stored "
                        "without its acknowledgement (re-sent with its id, it is stored "
                        "once)", cut, self.cfg.daemon.stop_timeout_s)
        if watcher:
            watcher.stop()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.committer.close)
        await self._stop_role()
        code = await loop.run_in_executor(None, self.supervisor.stop,
                                          self.cfg.daemon.stop_timeout_s)
        if metrics_server:
            metrics_server.stop()
        self.batcher.close()
        self._explain_pool.shutdown(wait=True)
        self.trust.close()  # writes the audit records still queued
        self.store.close()
        log.info("stopped cleanly (trainer exit code %s)", code)


def run_from_args(args: Any) -> int:
    overrides = cli_overrides(args)
    if getattr(args, "role", None):
        overrides["cluster.role"] = args.role
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        log.error("invalid configuration: %s", e)
        return 2
    try:
        cls: type[Daemon] = Daemon
        if cfg.cluster.role != "single":
            from ..cluster import daemon_class  # needs nats-py: the cluster extra
            cls = daemon_class(cfg.cluster.role)
        return asyncio.run(cls(cfg, config_path=args.config, overrides=overrides,
                               reinit=getattr(args, "reinit", False)).run())
    except (RuntimeError, OSError, StoreError) as e:
        log.error("gated could not start: %s", e)
        return 1
