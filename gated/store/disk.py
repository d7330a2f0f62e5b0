"""The filesystem under the state dir: its free space, the start-up check against
``daemon.disk_free_min_mib``, and LMDB's lock file given real blocks before LMDB maps it.

These ask the operating system, not LMDB, so they live apart from env.py: the daemon's
disk watch and its start-up check use them without an open environment.
"""

from __future__ import annotations

import errno
import os

from .errors import StoreError, StoreFullError

_FILE_MODE = 0o660


def human(n: float) -> str:
    """Bytes for an operator: 1.5 MiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


#: Bytes of LMDB's lock file with py-lmdb's default max_readers (126): the reader table
#: (125 slots of 64 bytes) plus its 192-byte header, as LMDB sizes it on creation.
LOCK_FILE_BYTES = 8192


def _existing(path: str) -> str:
    """``path``, or its nearest ancestor that exists (what statvfs can ask about)."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def disk_free(path: str | os.PathLike[str]) -> int | None:
    """Bytes an unprivileged writer may still use on the filesystem holding ``path`` (or
    its nearest existing ancestor); None when it cannot be asked."""
    try:
        st = os.statvfs(_existing(os.fspath(path)))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


_disk_free = disk_free


def check_free_space(path: str | os.PathLike[str], min_bytes: int, *,
                     key: str = "daemon.disk_free_min_mib") -> int | None:
    """Refuse (:class:`StoreFullError`) when the filesystem holding ``path`` has less than
    ``min_bytes`` free; returns the free bytes. Nothing is opened or changed."""
    path = os.fspath(path)
    free = disk_free(path)
    if free is not None and free < min_bytes:
        raise StoreFullError(
            f"not opening the gated state in {path}: its filesystem has {human(free)} free, "
            f"less than the {human(min_bytes)} required ({key}). Nothing was opened or "
            "changed, and everything stored so far is kept. Free space on that filesystem "
            f"(or lower {key}), then start again.")
    return free


def reserve_lock_file(path: str) -> list[str]:
    """Give LMDB's lock file real blocks before LMDB maps it (see env.py's module doc).

    Returns the files this call created (for the caller to remove if the open fails).
    Raises :class:`StoreFullError` on a full disk, having removed what it created.
    """
    lock = os.path.join(path, "lock.mdb")
    created = not os.path.exists(lock)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, _FILE_MODE)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _full_at_open(path, e) from e
        raise StoreError(f"cannot create {lock}: {e.strerror}; check that {path} is writable "
                         "by this user (nothing was changed)") from e
    try:
        size = os.fstat(fd).st_size or LOCK_FILE_BYTES
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        os.close(fd)
        fd = -1
        if created:
            _remove_quietly(lock)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _full_at_open(path, e) from e
        raise StoreError(f"cannot reserve LMDB's lock file {lock}: {e.strerror}; nothing "
                         "was changed") from e
    finally:
        if fd >= 0:
            os.close(fd)
    return [lock] if created else []


def _full_at_open(path: str, e: BaseException) -> StoreFullError:
    free = disk_free(path)
    why = getattr(e, "strerror", None) or str(e)
    return StoreFullError(
        f"cannot open the gated state in {path}: the filesystem holding it is full "
        f"({human(free) if free is not None else 'unknown'} free; {why}). Nothing "
        "was changed, and everything stored so far is kept. Free space on that filesystem, "
        "then start again.")


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _rmdir_quietly(path: str) -> None:
    try:
        os.rmdir(path)  # only if empty
    except OSError:
        pass
