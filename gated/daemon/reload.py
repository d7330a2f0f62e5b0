"""Hot reload of the config in a running daemon: file watching, SIGHUP, systemd.

:class:`ConfigWatcher` notices that the config file changed (watchdog, debounced);
:class:`Reloader` re-reads the file, re-applies the same command-line flags, and applies
only the keys of :data:`gated.config.SAFE_KEYS` (learning rate, loss weights, swap policy,
batch size, replay mix, thresholds and bands, signal weights, log level, retention) via
:func:`gated.config.diff_reload`. Keys that need a restart are refused with a log line and
keep their running values; an invalid file changes nothing and the last good config
stays. A reload is bracketed by RELOADING=1 ... READY=1 for systemd.

This is the daemon side of the config; gated.config itself (what the keys are, loading
and validating them) imports nothing of the daemon. The log lines keep the
``gated.config`` logger, which operators filter on.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from watchdog.events import FileSystemEventHandler

from ..config import Config, ConfigError, diff_reload, load_config
from . import systemd

log = logging.getLogger("gated.config")


@dataclass
class ReloadResult:
    """The outcome of one reload: ``config`` is what is in force afterwards."""

    ok: bool
    config: Config
    applied_keys: list[str] = field(default_factory=list)
    refused_keys: list[str] = field(default_factory=list)
    error: str | None = None


class Reloader:
    """Re-reads the config on demand and applies the safe changes; thread-safe.

    ``apply(config, applied_keys)`` is called (from the caller's thread: the watcher's, or
    the one handling SIGHUP) with the new config when some safe key changed; it must make
    the running daemon use it. If it raises, the reload counts as failed and the previous
    config stays current. ``metrics`` (optional) gets ``config_reload(ok)``. With
    ``notify`` the reload is bracketed by RELOADING=1 ... READY=1 for systemd, so start
    the watcher and the SIGHUP handler only after the daemon has sent its first READY.
    """

    def __init__(self, path: str | os.PathLike | None, overrides: Mapping[str, Any] | None,
                 current: Config, apply: Callable[[Config, list[str]], None], *,
                 metrics: Any = None, notify: bool = True,
                 env: Mapping[str, str] | None = None) -> None:
        self.path = None if path is None else Path(path)
        self.overrides = dict(overrides or {})
        self._current = current
        self._apply = apply
        self._metrics = metrics
        self._notify = notify
        self._env = env
        self._lock = threading.Lock()
        self.loaded_at = time.time()

    @property
    def current(self) -> Config:
        return self._current

    def reload(self, source: str = "SIGHUP") -> ReloadResult:
        with self._lock:
            if self._notify:
                systemd.reloading()
            try:
                return self._reload(source)
            finally:
                if self._notify:
                    systemd.ready()

    def _reload(self, source: str) -> ReloadResult:
        where = f"config reload ({source})" + (f" from {self.path}" if self.path else "")
        old = self._current
        try:
            new = load_config(self.path, self.overrides, env=self._env)
        except ConfigError as e:
            return self._failed(where, str(e))
        applied, applied_keys, refused_keys = diff_reload(old, new)
        if refused_keys:
            log.warning("%s: not applied, these keys need a restart: %s; the running values "
                        "stay until `systemctl restart gated`", where,
                        ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}"
                                  for k in refused_keys))
        if applied_keys:
            try:
                self._apply(applied, applied_keys)
            except Exception as e:  # noqa: BLE001 - the daemon must survive a bad apply
                log.exception("%s: applying %s failed", where, ", ".join(applied_keys))
                return self._failed(where, f"applying the new values failed: {e}")
            log.info("%s: applied %s", where, ", ".join(
                f"{k} {old.get(k)!r} -> {applied.get(k)!r}" for k in applied_keys))
        elif not refused_keys:
            log.info("%s: no changes", where)
        self._current = applied
        self.loaded_at = time.time()
        if self._metrics is not None:
            self._metrics.config_reload(True)
        return ReloadResult(True, applied, applied_keys, refused_keys)

    def _failed(self, where: str, error: str) -> ReloadResult:
        log.error("%s failed: %s; keeping the last good config (loaded %s). Fix the file "
                  "and save it again, or send SIGHUP.", where, error,
                  time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.loaded_at)))
        if self._metrics is not None:
            self._metrics.config_reload(False)
        return ReloadResult(False, self._current, error=error)


class ConfigWatcher:
    """Calls ``on_change()`` once the config file has changed and settled.

    It watches the file's DIRECTORY (editors and config managers replace a file by
    writing a temporary one and renaming it over the original, which a watch on the file
    itself would lose) and keeps events that name the file: modified, closed after
    writing, created, or moved onto it. Events are debounced: the callback runs once
    ``debounce`` seconds after the last event, from the watcher's own thread, and only if
    the file's bytes differ from the last time (so a save that changes nothing, or
    several events of one save, reload once). If the file is a symlink, changes to its
    target elsewhere are not seen: send SIGHUP.
    """

    _EVENTS = frozenset({"modified", "closed", "created", "moved"})

    def __init__(self, path: str | os.PathLike, on_change: Callable[[], None], *,
                 debounce: float = 0.2) -> None:
        from watchdog.observers import Observer

        self.path = Path(path).absolute()
        self.on_change = on_change
        self.debounce = debounce
        self._digest = self._read_digest()
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._stopping = False
        self._observer = Observer()
        self._observer.daemon = True
        self._observer.schedule(_Handler(self), str(self.path.parent), recursive=False)
        self._worker = threading.Thread(target=self._run, name="gated-config-watch",
                                        daemon=True)
        self._started = False

    def start(self) -> ConfigWatcher:
        self._observer.start()
        self._worker.start()
        self._started = True
        log.info("watching %s for changes", self.path)
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._started:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._worker.join(timeout=5)

    def __enter__(self) -> ConfigWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _read_digest(self) -> bytes | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).digest()
        except OSError:
            return None

    def _event(self, event: Any) -> None:
        if event.is_directory or event.event_type not in self._EVENTS:
            return
        names = [event.src_path]
        if event.event_type == "moved":
            names = [event.dest_path]
        if not any(Path(os.fsdecode(n)).absolute() == self.path for n in names):
            return
        with self._cond:
            self._deadline = time.monotonic() + self.debounce
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (
                        self._deadline is None or time.monotonic() < self._deadline):
                    timeout = None if self._deadline is None else \
                        max(0.0, self._deadline - time.monotonic())
                    self._cond.wait(timeout)
                if self._stopping:
                    return
                self._deadline = None
            digest = self._read_digest()
            if digest is None or digest == self._digest:
                continue  # gone for now (a new file will follow), or unchanged
            self._digest = digest
            try:
                self.on_change()
            except Exception:  # noqa: BLE001 - keep watching whatever the callback does
                log.exception("config change handler failed; still watching %s", self.path)


class _Handler(FileSystemEventHandler):
    """Forwards every watchdog event of the directory to the watcher's filter."""

    def __init__(self, watcher: ConfigWatcher) -> None:
        super().__init__()
        self.watcher = watcher

    def dispatch(self, event: Any) -> None:
        self.watcher._event(event)
