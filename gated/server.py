"""`gated run`: the asyncio Unix-socket server and the wiring of every part.

Threads and who owns what:
- the event loop (this module): sockets, request validation, replies; never blocks on
  LMDB or on the model (commits and predictions run elsewhere and are awaited);
- the group-commit writer (store): the only writer of the signal log;
- the trainer (trainer.py): the only writer of checkpoints, snapshots, replay, history;
- a small thread pool: predict / explain on the immutable serving snapshot;
- the config watcher (watchdog) and the metrics HTTP server.
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

from . import __version__, systemd
from .config import Config, ConfigError, ConfigWatcher, Reloader, cli_overrides, load_config
from .device import choose_backend, describe_preflight
from .engine import ModelConfig
from .metrics import Metrics
from .protocol import FrameDecoder, ProtocolError, Request, error_reply, ok_reply, pack
from .serving import Bands
from .signals import SignalError, WeightTable, validate_signal
from .store import GroupCommitter, Store, StoreError, StoreFullError
from .trainer import AlignmentWindow, TrainerEvents, build_trainer

log = logging.getLogger("gated")

DRAIN_SECONDS = 30.0  # SIGTERM: train what is queued for at most this long, then stop


class MetricsEvents(TrainerEvents):
    """Trainer events -> Prometheus series."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics
        self._scored_seen = 0

    def on_step(self, info: dict, seconds: float) -> None:
        self.m.observe_step(info, seconds)

    def on_scored(self, window: AlignmentWindow, converged: bool,
                  stats: dict | None = None, backpropagated: int = 0) -> None:
        new = window.total_scored - self._scored_seen
        self._scored_seen = window.total_scored
        self.m.set_alignment(window.alignment, len(window.items), window.confusion(),
                             converged, scored=new)
        if stats is not None:
            self.m.set_learning(stats, backpropagated)

    def on_drift(self, began_seq: int, dropped: int) -> None:
        self.m.drifted(dropped)

    def on_swap(self, version: int) -> None:
        self.m.swapped(version)

    def on_rollback(self, reason: str) -> None:
        self.m.rolled_back()

    def on_checkpoint(self, ts: float) -> None:
        self.m.checkpointed(ts)

    def on_gpu_fallback(self, reason: str) -> None:
        self.m.gpu_fallback()
        self.m.set_backend("numpy", "cpu", f"switched from the GPU after repeated failures "
                           f"(last: {reason})")


def weight_table(cfg: Config) -> WeightTable:
    return WeightTable(confirm=cfg.weights.confirm, override=cfg.weights.override,
                       escalation=tuple(cfg.weights.fp_fn))


class Daemon:
    def __init__(self, cfg: Config, *, config_path: str | None = None,
                 overrides: dict | None = None, reinit: bool = False) -> None:
        self.cfg = cfg
        self.config_path, self.overrides, self.reinit = config_path, overrides or {}, reinit
        self.metrics = Metrics()
        self.started = time.time()
        self._stop = asyncio.Event()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gated-predict")
        self._connections: set[asyncio.Task] = set()
        self._draining = False

    # --- requests ------------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        decoder = FrameDecoder(self.cfg.limits)
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    return
                for item in decoder.feed(data):
                    if isinstance(item, ProtocolError):
                        self.metrics.rejected(item.code)
                        writer.write(pack(item.reply()))
                        if item.fatal:
                            await writer.drain()
                            return
                        continue
                    writer.write(pack(await self.dispatch(item)))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:
            return
        finally:
            if task is not None:
                self._connections.discard(task)
            writer.close()

    async def dispatch(self, req: Request) -> dict[str, Any]:
        try:
            if req.op == "ping":
                return ok_reply(req.rid, pong=True, version=self.serving.current.version)
            if req.op == "status":
                return ok_reply(req.rid, **self.status())
            if req.op in ("predict", "explain"):
                return await self._predict(req)
            if self._draining:
                return error_reply(req.rid, "shutting_down", "the daemon is stopping; "
                                   "nothing was stored, resend after it restarts")
            if req.op == "signal":
                result = (await self._ingest([req.signal]))[0]
                if "error" in result:
                    return error_reply(req.rid, result["error"]["code"],
                                       result["error"]["message"])
                return ok_reply(req.rid, **result)
            return ok_reply(req.rid, results=await self._ingest(req.signals or []))
        except StoreFullError as e:
            log.error("storing signals failed, the disk or map is full: %s", e)
            return error_reply(req.rid, "store_full", f"the signals were NOT stored: {e}")
        except StoreError as e:
            log.error("storing signals failed: %s", e)
            return error_reply(req.rid, "internal", f"the signals were NOT stored: {e}")
        except Exception as e:  # noqa: BLE001 - one bad request never takes the daemon down
            log.exception("request %r failed", req.op)
            return error_reply(req.rid, "internal", f"{type(e).__name__}: {e}")

    async def _ingest(self, entries: list) -> list[dict]:
        """Validate, group-commit, acknowledge: a result per entry, in order."""
        results: list[dict | None] = [None] * len(entries)
        valid, where = [], []
        for i, entry in enumerate(entries):
            if isinstance(entry, ProtocolError):
                results[i] = {"error": entry.as_dict()}
                continue
            try:
                valid.append(validate_signal(entry))
                where.append(i)
            except SignalError as e:
                results[i] = {"error": e.to_dict()}
        for r in results:
            if r is not None:
                self.metrics.rejected(r["error"]["code"])
        if valid:
            acks = await asyncio.wrap_future(self.committer.submit(valid))
            for i, (seq, dup) in zip(where, acks, strict=True):
                results[i] = {"seq": seq, "duplicate": dup}
            self.metrics.received(len(valid))
            self.trainer.wake()
        return results  # type: ignore[return-value]

    async def _predict(self, req: Request) -> dict[str, Any]:
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        fn = self.serving.predict if req.op == "predict" else self.serving.explain
        out = await loop.run_in_executor(self._pool, fn, req.context, req.history or None)
        self.metrics.observe_predict(time.perf_counter() - t0, req.op)
        return ok_reply(req.rid, **out)

    def queue_depth(self, last_seq: int | None = None) -> int:
        """Signals acknowledged but not trained on yet."""
        last = self.store.last_seq() if last_seq is None else last_seq
        return max(0, last - self.trainer.status.last_trained_seq)

    def compute(self) -> tuple[str, str]:
        """(backend, device) now: the CPU once the trainer has fallen back from the GPU."""
        if self.backend != "numpy" and not self.trainer.on_gpu:
            return "numpy", "cpu"
        return self.backend, self.device

    def status(self) -> dict[str, Any]:
        t, w = self.trainer.status, self.trainer.window
        last_seq = self.store.last_seq()
        backend, device = self.compute()
        return {
            "version": self.serving.current.version, "step": t.step,
            "last_trained_seq": t.last_trained_seq, "last_seq": last_seq,
            "queue_depth": self.queue_depth(last_seq),
            "scored": w.total_scored, "alignment": w.alignment, "window": len(w.items),
            "converged": self.trainer.converged(),
            "confusion": w.confusion(), "loss": t.last_loss, "lr": self.trainer.opt.lr,
            "learning": self.trainer.monitor.stats(),
            "rollbacks": t.rollbacks, "swaps": t.swaps, "last_checkpoint": t.last_checkpoint,
            "backend": backend, "device": device, "preset": self.cfg.daemon.preset,
            "params": self.trainer.model.num_params, "uptime_s": time.time() - self.started,
            "gated_version": __version__, "config": self.cfg.to_dict()["train"],
        }

    # --- config reload ----------------------------------------------------------------------
    def apply_config(self, new: Config, keys: list[str]) -> None:
        """Apply hot-reloadable keys (called from the watcher thread or on SIGHUP)."""
        self.cfg = new
        logging.getLogger().setLevel(new.daemon.log_level)
        self.trainer.update_settings(new.train)
        self.trainer.retention = new.retention
        self.serving.bands = Bands(new.bands.allow, new.bands.block)
        self.committer.set_weights(weight_table(new))

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

    async def run(self) -> int:
        faulthandler.enable()
        cfg = self.cfg
        logging.getLogger().setLevel(cfg.daemon.log_level)
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
        Path(cfg.daemon.state_dir).mkdir(parents=True, exist_ok=True)
        self.store = Store(cfg.daemon.state_dir, replay_slots=cfg.train.replay_slots)
        self.events = MetricsEvents(self.metrics)
        self.trainer, self.serving = build_trainer(
            self.store, model_cfg, cfg.train, seed=cfg.daemon.seed, backend=self.backend,
            serving_bands=Bands(cfg.bands.allow, cfg.bands.block), events=self.events,
            reinit=self.reinit)
        self.trainer.retention = cfg.retention
        self.trainer.report_alignment()  # the restored alignment window
        self.metrics.weights_version.set(self.serving.current.version)
        self.committer = GroupCommitter(self.store, weights=weight_table(cfg))
        metrics_server = self.metrics.serve(cfg.daemon.metrics_addr) \
            if cfg.daemon.metrics_addr else None
        if metrics_server:
            log.info("metrics on %s", metrics_server.url)
        server = await asyncio.start_unix_server(self.handle, sock=self._listen_socket(),
                                                 limit=1 << 16)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        reloader = Reloader(self.config_path, self.overrides, cfg, self.apply_config,
                            metrics=self.metrics)
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.run_in_executor(
            None, reloader.reload, "SIGHUP"))
        self.trainer.start()
        log.info("gated %s ready: preset %s (%d parameters), version %d, step %d, state %s",
                 __version__, cfg.daemon.preset, self.trainer.model.num_params,
                 self.serving.current.version, self.trainer.status.step, cfg.daemon.state_dir)
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

    def _status_line(self) -> str:
        t, w = self.trainer.status, self.trainer.window
        return (f"step {t.step}, version {t.version}, alignment {w.alignment:.3f} over "
                f"{len(w.items)}, queue {self.queue_depth()}")

    async def _supervise(self) -> None:
        """Main loop: STATUS, WATCHDOG after a health check, queue-depth metric."""
        interval = systemd.watchdog_interval()
        tick = min(interval, 2.0) if interval else 2.0
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=tick)
            except TimeoutError:
                pass
            self.metrics.queue_depth.set(self.queue_depth())
            if not self.trainer.is_alive() and not self._stop.is_set():
                log.error("the trainer thread died; stopping so systemd restarts the daemon "
                          "(every acknowledged signal is in the log)")
                self._stop.set()
                break
            systemd.status(self._status_line())
            systemd.watchdog_ping()

    async def _shutdown(self, server, watcher, metrics_server) -> None:
        log.info("stopping: draining the queue and checkpointing")
        systemd.stopping("draining and checkpointing")
        self._draining = True
        server.close()
        for task in list(self._connections):
            task.cancel()
        if watcher:
            watcher.stop()
        await asyncio.get_running_loop().run_in_executor(None, self._stop_threads)
        if metrics_server:
            metrics_server.stop()
        self._pool.shutdown(wait=True)
        self.store.close()
        log.info("stopped cleanly")

    def _stop_threads(self) -> None:
        self.committer.close()
        self.trainer.stop(drain=True, timeout=DRAIN_SECONDS)
        self.trainer.join()


def run_from_args(args: Any) -> int:
    overrides = cli_overrides(args)
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        log.error("invalid configuration: %s", e)
        return 2
    try:
        return asyncio.run(Daemon(cfg, config_path=args.config, overrides=overrides,
                                  reinit=getattr(args, "reinit", False)).run())
    except (RuntimeError, OSError, StoreError) as e:
        log.error("gated could not start: %s", e)
        return 1
