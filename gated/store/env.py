"""The process's one LMDB environment per state dir, and the transaction runner.

Why a registry: LMDB forbids opening the same environment twice in one process (closing
the second handle would drop the first one's POSIX locks; py-lmdb refuses outright). Every
`Store` and every `load_published` call in a process therefore shares one `EnvHandle`
per state dir. A handle remembers the pid that opened it and refuses to work in a forked
child (LMDB environments must never cross a fork): the child opens its own.

Why a gate: ``env.set_mapsize`` (growing the map, or adopting a size another process
grew it to) is only allowed while this process has no transaction open. Transactions take
the gate shared; a resize takes it exclusive. Transactions are short (no long-lived
readers), so a resize waits at most one commit.

Durability: ``sync=True, metasync=True, writemap=False`` -- a commit returns only after the
data and the meta page are on disk, and a crash can never expose a half-written page
through the map (which is what writemap with async flushing would risk).

A full filesystem: LMDB maps its lock file (lock.mdb) and writes its reader table through
that map. Where the file's pages have no blocks behind them (a new or sparse lock file on
a full tmpfs, or on ext4 when the state dir already exists), the first store into the map
kills the process with SIGBUS -- no error return is possible. So the lock file's blocks are
reserved (``posix_fallocate``, disk.py) before LMDB opens it: on a full disk that fails with
ENOSPC and the open is refused with a clear :class:`StoreFullError`, leaving nothing
behind. The data file is written with ``pwrite`` (``writemap=False``), so a full disk there
is an ordinary error.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import lmdb

from .disk import (
    _FILE_MODE,
    _disk_free,
    _full_at_open,
    _remove_quietly,
    _rmdir_quietly,
    human,
    reserve_lock_file,
)
from .errors import StoreError, StoreFullError

log = logging.getLogger("gated.store")

T = TypeVar("T")

#: Named databases (DESIGN.md section 4).
DB_NAMES = ("signals", "meta", "ckpt", "published", "replay", "dedup", "fingerprints",
            "metrics", "overrides", "audit")
MAX_DBS = 16
FORMAT_VERSION = 1

MiB = 1 << 20
DEFAULT_MAP_SIZE = 256 * MiB
DEFAULT_MAX_MAP_SIZE = 1 << 40
_MIN_GROW = 1 * MiB


class _Gate:
    """Many transactions at once, or one map resize alone (writer-preferring, re-entrant)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._exclusive = False
        self._waiting = 0
        self._local = threading.local()

    @contextmanager
    def shared(self) -> Iterator[None]:
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            with self._cond:
                while self._exclusive or self._waiting:
                    self._cond.wait()
                self._active += 1
        self._local.depth = depth + 1
        try:
            yield
        finally:
            self._local.depth = depth
            if depth == 0:
                with self._cond:
                    self._active -= 1
                    if self._active == 0:
                        self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        if getattr(self._local, "depth", 0):
            raise RuntimeError("map resize requested inside a transaction")
        with self._cond:
            self._waiting += 1
            try:
                while self._exclusive or self._active:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class EnvHandle:
    """One open lmdb.Environment plus what it takes to use it safely from many threads."""

    def __init__(self, path: str, *, readonly: bool, map_size: int, max_map_size: int,
                 growth: float) -> None:
        self.path = path
        self.readonly = readonly
        self.map_size = map_size
        self.max_map_size = max(max_map_size, map_size)
        self.growth = max(growth, 1.1)
        self.pid = os.getpid()
        self.gate = _Gate()
        self._dbi_lock = threading.Lock()
        self.refs = 0
        self.env: lmdb.Environment | None = None
        self.dbs: dict[str, Any] = {}
        self.needs_reopen = False
        self.stats = {"grows": 0, "remaps": 0, "reopens": 0, "commits": 0}
        self._open()

    # --- open / close ------------------------------------------------------------------------
    def _open(self) -> None:
        if self.readonly:
            if not os.path.exists(os.path.join(self.path, "data.mdb")):
                raise StoreError(f"no gated state in {self.path} (data.mdb missing); check "
                                 "--state-dir, or start the daemon once to create it")
            if not os.path.exists(os.path.join(self.path, "lock.mdb")) \
                    and os.access(self.path, os.W_OK):
                reserve_lock_file(self.path)  # LMDB would create it, and map it
            try:
                env = lmdb.open(self.path, readonly=True, create=False, map_size=0,
                                subdir=True, max_dbs=MAX_DBS, lock=True)
            except lmdb.Error as e:
                raise StoreError(f"cannot open the gated state in {self.path} read-only: "
                                 f"{e}; check the path and that this user may read it "
                                 "and write its lock.mdb") from e
            self.env, self.dbs = env, {}
            return
        made_dir = not os.path.isdir(self.path)
        try:
            os.makedirs(self.path, mode=0o750, exist_ok=True)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _full_at_open(self.path, e) from e
            raise StoreError(f"cannot create the state dir {self.path}: {e.strerror}; check "
                             "--state-dir and that this user may create it") from e
        data = os.path.join(self.path, "data.mdb")
        size = self.map_size
        fresh = not os.path.exists(data)
        if not fresh:
            size = max(size, os.path.getsize(data))
        size = min(-(-size // 65536) * 65536, max(self.max_map_size, size))
        try:
            created = reserve_lock_file(self.path)
        except StoreError:
            if made_dir:
                _rmdir_quietly(self.path)
            raise
        if fresh:
            created.append(data)

        def undo() -> None:
            """A failed first open leaves nothing behind (an empty data.mdb, our lock)."""
            for f in created:
                if f != data or (os.path.exists(f) and os.path.getsize(f) == 0):
                    _remove_quietly(f)
            if made_dir:
                _rmdir_quietly(self.path)

        try:
            env = lmdb.open(self.path, map_size=size, subdir=True, readonly=False, create=True,
                            metasync=True, sync=True, map_async=False, writemap=False,
                            max_dbs=MAX_DBS, lock=True, mode=_FILE_MODE)
        except lmdb.Error as e:
            undo()
            if isinstance(e, lmdb.DiskError) or "No space left" in str(e):
                raise _full_at_open(self.path, e) from e
            if "already open" in str(e):
                raise StoreError(f"{self.path} is already open in this process, or was open "
                                 "in the parent when this process forked: LMDB environments "
                                 "must not cross fork(); open the Store only in the process "
                                 "that uses it (or start children with 'spawn')") from e
            raise StoreError(f"cannot open the gated state in {self.path}: {e}; check that "
                             "the directory is writable by this user and the disk is "
                             "mounted (the state itself is not modified)") from e
        try:
            stale = env.reader_check()
            if stale:
                log.info("cleared %d stale LMDB reader slot(s) left by killed processes", stale)
            # One transaction for every database: on an existing state nothing is dirty,
            # so the commit costs no fsync and opening stays fast.
            with env.begin(write=True) as txn:
                self.dbs = {name: env.open_db(name.encode(), txn=txn) for name in DB_NAMES}
                fmt = txn.get(b"format", db=self.dbs["meta"])
                if fmt is None:
                    txn.put(b"format", str(FORMAT_VERSION).encode(), db=self.dbs["meta"])
                elif int(fmt) > FORMAT_VERSION:
                    raise StoreError(f"{self.path} holds state format {int(fmt)}, newer than "
                                     f"this gated understands ({FORMAT_VERSION}); upgrade "
                                     "gated or point --state-dir elsewhere")
        except lmdb.Error as e:
            env.close()
            if isinstance(e, lmdb.DiskError) or "No space left" in str(e):
                raise _full_at_open(self.path, e) from e
            raise StoreError(f"cannot prepare the gated state in {self.path}: {e}; "
                             "nothing was changed; free disk space if the disk is full") from e
        except BaseException:
            env.close()
            raise
        self.env = env

    def db(self, name: str) -> Any | None:
        """The named database, or None when a read-only env does not have it (yet)."""
        return self.dbs.get(name)

    def _open_missing_dbs(self) -> None:
        """Read-only: pick up databases the writer created since. Done before a read
        transaction begins: a handle opened later is not valid inside that transaction."""
        assert self.env is not None
        with self._dbi_lock:  # mdb_dbi_open must not run concurrently
            self._open_missing_dbs_locked()

    def _open_missing_dbs_locked(self) -> None:
        assert self.env is not None
        for name in DB_NAMES:
            if name not in self.dbs:
                try:
                    self.dbs[name] = self.env.open_db(name.encode(), create=False)
                except (lmdb.NotFoundError, lmdb.ReadonlyError):
                    pass

    def close(self) -> None:
        with self.gate.exclusive():
            if self.env is not None:
                self.env.close()
                self.env = None
                self.dbs = {}

    def check_pid(self) -> None:
        if os.getpid() != self.pid:
            raise StoreError(f"this Store for {self.path} was opened by process {self.pid} "
                             f"and cannot be used in process {os.getpid()} after fork(): "
                             "LMDB environments must not cross fork; open the Store in the "
                             "child only (the parent must not hold it when forking, or start "
                             "children with 'spawn')")

    # --- running transactions -------------------------------------------------------------------
    def read(self, fn: Callable[[lmdb.Transaction], T], *, buffers: bool = False) -> T:
        """Run ``fn`` in a short read transaction (re-reading the map size if it grew)."""
        self.check_pid()
        while True:
            if self.needs_reopen:
                self._reopen()
            with self.gate.shared():
                if self.env is None:
                    raise StoreError(f"the store for {self.path} is closed")
                try:
                    if self.readonly and len(self.dbs) < len(DB_NAMES):
                        self._open_missing_dbs()
                    txn = self.env.begin(buffers=buffers)
                except lmdb.MapResizedError:
                    pass
                else:
                    try:
                        return fn(txn)
                    finally:
                        txn.abort()
            self.remap()

    def write(self, fn: Callable[[lmdb.Transaction], T], *, what: str) -> T:
        """Run ``fn`` in one write transaction and commit; returns only after the commit.

        ``fn`` may run more than once (a full map is grown and the whole transaction
        retried), so it must not change anything outside the transaction.
        """
        self.check_pid()
        if self.readonly:
            raise StoreError(f"{what}: the store for {self.path} is open read-only")
        while True:
            if self.needs_reopen:
                self._reopen()
            full_at: int | None = None
            with self.gate.shared():
                if self.env is None:
                    raise StoreError(f"the store for {self.path} is closed")
                try:
                    txn = self.env.begin(write=True)
                except lmdb.MapResizedError:
                    txn = None
                except lmdb.Error as e:
                    raise self._failure(e, what) from e
                if txn is not None:
                    try:
                        result = fn(txn)
                        txn.commit()
                        self.stats["commits"] += 1
                        return result
                    except lmdb.MapFullError:
                        txn.abort()
                        full_at = self.env.info()["map_size"]
                    except lmdb.Error as e:
                        txn.abort()
                        raise self._failure(e, what) from e
                    except OSError as e:
                        txn.abort()
                        raise self._failure(e, what) from e
                    except BaseException:
                        txn.abort()
                        raise
            if full_at is None:
                self.remap()
            else:
                self._grow(full_at, what)

    # --- map size ---------------------------------------------------------------------------------
    def _grow(self, seen: int, what: str) -> None:
        with self.gate.exclusive():
            assert self.env is not None
            current = self.env.info()["map_size"]
            if current > seen:
                return  # another thread grew it meanwhile
            if current >= self.max_map_size:
                raise StoreFullError(
                    f"{what} did not commit: the LMDB map of {self.path} is full at its "
                    f"configured cap max_map_size={human(self.max_map_size)}. Nothing from "
                    "this write was acknowledged; everything acknowledged before is kept. "
                    "Raise max_map_size, or prune trained signals (retention), then retry.")
            self.env.reader_check()
            new = min(max(int(current * self.growth), current + _MIN_GROW), self.max_map_size)
            new = min(-(-new // 65536) * 65536, self.max_map_size)
            self.env.set_mapsize(new)
            self.stats["grows"] += 1
            log.info("LMDB map of %s grown from %s to %s (for %s)", self.path, human(current),
                     human(new), what)

    def remap(self) -> None:
        """Another process grew the map: adopt its size (LMDB reads it from the meta page)."""
        with self.gate.exclusive():
            assert self.env is not None
            self.env.set_mapsize(0)
            self.stats["remaps"] += 1

    def _reopen(self) -> None:
        with self.gate.exclusive():
            if not self.needs_reopen:
                return
            if self.env is not None:
                self.env.close()
                self.env = None
            self._open()
            self.needs_reopen = False
            self.stats["reopens"] += 1
            log.info("LMDB environment %s reopened after a failed commit", self.path)

    def _failure(self, e: BaseException, what: str) -> StoreError:
        """Turn a failed commit into an operator-facing error; reopen before the next write."""
        self.needs_reopen = True
        free = _disk_free(self.path)
        code = getattr(e, "errno", None)
        text = str(e)
        disk_full = (isinstance(e, lmdb.DiskError) or code in (errno.ENOSPC, errno.EDQUOT)
                     or "No space left" in text or "quota" in text.lower()
                     or ("Input/output error" in text and free is not None and free < 64 * MiB))
        kept = ("Nothing from this write was acknowledged; everything acknowledged before is "
                "kept and the state opens again once there is room.")
        if disk_full:
            return StoreFullError(
                f"{what} did not commit: the disk holding {self.path} is full "
                f"({human(free) if free is not None else 'unknown'} free; LMDB said: {text}). "
                f"{kept} Free space on that filesystem, then retry (a re-sent signal with an "
                "id is not stored twice).")
        if isinstance(e, lmdb.PanicError):
            return StoreError(f"{what} failed: LMDB reported a fatal error on {self.path} "
                              f"({text}); the environment will be reopened on the next write. "
                              f"{kept}")
        return StoreError(f"{what} failed on {self.path}: {text}. {kept} Check the disk "
                          "(dmesg) and retry.")


# --- the per-process registry -----------------------------------------------------------------
_registry: dict[str, EnvHandle] = {}
_registry_lock = threading.Lock()
_abandoned: list[EnvHandle] = []  # handles inherited over fork: never touched, never closed


def _key(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(path))


def acquire(path: str | os.PathLike[str], *, readonly: bool, map_size: int = DEFAULT_MAP_SIZE,
            max_map_size: int = DEFAULT_MAX_MAP_SIZE, growth: float = 2.0) -> EnvHandle:
    """The shared handle for ``path``, opening it if needed (writable beats read-only)."""
    key = _key(path)
    with _registry_lock:
        handle = _registry.get(key)
        if handle is not None and handle.pid != os.getpid():
            _abandoned.append(_registry.pop(key))
            handle = None
        if handle is not None and handle.readonly and not readonly:
            if handle.refs:
                raise StoreError(f"{key} is open read-only in this process; close that reader "
                                 "before opening the Store for writing")
            handle.close()
            del _registry[key]
            handle = None
        if handle is not None and handle.env is None:
            del _registry[key]
            handle = None
        if handle is None:
            handle = EnvHandle(key, readonly=readonly, map_size=map_size,
                               max_map_size=max_map_size, growth=growth)
            _registry[key] = handle
        elif not readonly:
            handle.max_map_size = max(handle.max_map_size, max_map_size)
        handle.refs += 1
        return handle


def release(handle: EnvHandle, *, keep_open: bool = False) -> None:
    """Drop one reference; a writable env closes with its last Store (read-only ones stay
    cached for the next `load_published`, unless ``keep_open`` is False and none is left)."""
    with _registry_lock:
        handle.refs -= 1
        if handle.refs > 0 or handle.pid != os.getpid():
            return
        if handle.readonly and keep_open:
            return
        handle.close()
        if _registry.get(handle.path) is handle:
            del _registry[handle.path]


def current(path: str | os.PathLike[str]) -> EnvHandle | None:
    """The handle this process already has open for ``path``, if any."""
    with _registry_lock:
        handle = _registry.get(_key(path))
        if handle is None or handle.pid != os.getpid() or handle.env is None:
            return None
        return handle


def close_readers() -> None:
    """Close cached read-only environments (tests; a long-lived reader process need not)."""
    with _registry_lock:
        for key, handle in list(_registry.items()):
            if handle.readonly and handle.refs == 0 and handle.pid == os.getpid():
                handle.close()
                del _registry[key]
