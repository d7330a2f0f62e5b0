"""systemd integration in plain Python: sd_notify and socket activation.

No dependency on python-systemd or libsystemd: the notify protocol is one datagram of
``KEY=VALUE`` lines to the AF_UNIX socket named by ``$NOTIFY_SOCKET`` (a path, or an
abstract name written with a leading ``@``), and socket activation is a range of file
descriptors starting at 3 described by ``$LISTEN_PID``, ``$LISTEN_FDS`` and
``$LISTEN_FDNAMES`` (see sd_notify(3), sd_listen_fds(3)).

Outside systemd (``NOTIFY_SOCKET`` unset) every notify call is a cheap no-op returning
False, so the daemon calls them unconditionally.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import MutableMapping

log = logging.getLogger("gated.systemd")

SD_LISTEN_FDS_START = 3
_warned = False


def _address(env: MutableMapping[str, str]) -> str | None:
    addr = env.get("NOTIFY_SOCKET")
    if not addr:
        return None
    if addr.startswith("@"):
        return "\0" + addr[1:]  # abstract namespace
    if addr.startswith("/"):
        return addr
    global _warned
    if not _warned:  # e.g. "vsock:..." (systemd in a VM): not supported here
        log.warning("NOTIFY_SOCKET=%r is not a Unix socket path; systemd notifications "
                    "are off", addr)
        _warned = True
    return None


def notify(state: str, *, env: MutableMapping[str, str] | None = None) -> bool:
    """Send ``state`` (newline-separated ``KEY=VALUE`` lines) to systemd.

    Returns True when the datagram was sent, False when not running under a notify
    socket or when sending failed (logged: the daemon must not die because its
    supervisor's socket hiccuped, but the operator should learn why the unit may time
    out).
    """
    addr = _address(os.environ if env is None else env)
    if addr is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(state.encode("utf-8"), addr)
        return True
    except OSError as e:
        log.warning("sd_notify %r to %s failed: %s", state.split("\n", 1)[0],
                    addr.replace("\0", "@"), e)
        return False


def ready(status: str | None = None) -> bool:
    """READY=1: start-up (or a reload) is finished; systemd marks the unit active."""
    return notify("READY=1" + (f"\nSTATUS={_line(status)}" if status else ""))


def status(text: str) -> bool:
    """STATUS=...: one line shown by ``systemctl status gated``."""
    return notify(f"STATUS={_line(text)}")


def watchdog_ping() -> bool:
    """WATCHDOG=1: the service is healthy (send at least every watchdog_interval())."""
    return notify("WATCHDOG=1")


def reloading() -> bool:
    """RELOADING=1 with MONOTONIC_USEC, as systemd >= 253 requires; follow with ready()."""
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify(f"RELOADING=1\nMONOTONIC_USEC={usec}")


def stopping(status: str | None = None) -> bool:
    """STOPPING=1: shutdown has begun (draining, checkpointing)."""
    return notify("STOPPING=1" + (f"\nSTATUS={_line(status)}" if status else ""))


def _line(text: str) -> str:
    return " ".join(str(text).split())  # one line: a newline would start a new KEY=


def watchdog_timeout(env: MutableMapping[str, str] | None = None) -> float | None:
    """WatchdogSec= in seconds when the watchdog is on for THIS process, else None."""
    env = os.environ if env is None else env
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid.strip() != str(os.getpid()):
        return None  # meant for another process (we were forked or exec'ed by it)
    try:
        value = int(usec)
    except ValueError:
        log.warning("WATCHDOG_USEC=%r is not a number; not sending watchdog pings", usec)
        return None
    return value / 1e6 if value > 0 else None


def watchdog_interval(env: MutableMapping[str, str] | None = None) -> float | None:
    """How often to ping, in seconds: half of WatchdogSec= (sd_watchdog_enabled(3)'s
    advice), or None when the watchdog is off."""
    timeout = watchdog_timeout(env)
    return None if timeout is None else timeout / 2


def listen_fds_with_names(*, unset_env: bool = True,
                          env: MutableMapping[str, str] | None = None,
                          ) -> list[tuple[str, socket.socket]]:
    """The sockets systemd passed (socket activation), with their FileDescriptorName=.

    Honours ``LISTEN_PID`` (the variables are for this process only, not for a child that
    inherited the environment), takes ``LISTEN_FDS`` descriptors starting at fd 3, marks
    them close-on-exec and, by default, removes the three variables so children do not
    see them. Names default to "unknown" as in sd_listen_fds_with_names(3).
    """
    env = os.environ if env is None else env
    pid, count = env.get("LISTEN_PID"), env.get("LISTEN_FDS")
    names_s = env.get("LISTEN_FDNAMES")
    if unset_env:
        for k in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            env.pop(k, None)
    if not pid or not count:
        return []
    try:
        if int(pid) != os.getpid():
            return []
        n = int(count)
    except ValueError:
        log.warning("ignoring malformed LISTEN_PID=%r / LISTEN_FDS=%r", pid, count)
        return []
    names = names_s.split(":") if names_s else []
    out = []
    for i in range(n):
        fd = SD_LISTEN_FDS_START + i
        os.set_inheritable(fd, False)
        name = names[i] if i < len(names) and names[i] else "unknown"
        out.append((name, socket.socket(fileno=fd)))
    return out


def listen_fds(*, unset_env: bool = True,
               env: MutableMapping[str, str] | None = None) -> list[socket.socket]:
    """The sockets systemd passed, in order (empty when not socket-activated)."""
    return [s for _, s in listen_fds_with_names(unset_env=unset_env, env=env)]
