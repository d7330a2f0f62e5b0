"""The socket side of the daemon: one asyncio Protocol per connection, and the bounds
shared by all of them (docs/protocol.md, "Limits").

Bytes are decoded as they arrive (:class:`~gated.protocol.FrameDecoder`); each
connection's requests are answered in order by one task of its own. While it has
requests to answer, it takes at most one more read from that connection and then reads
nothing more until they are answered (the rest waits in the kernel's socket buffer, and
a client that keeps sending blocks); a client that waits for each reply costs no
pausing at all. Across every connection:

- at most ``limits.max_connections`` are open: one more gets ``overloaded`` (rid nil)
  and is closed;
- at most ``limits.max_buffered_bytes`` are held: bytes received and not yet answered,
  the incomplete tail of a message included. A read that would pass the bound gets
  ``overloaded`` (rid nil) and its connection is closed (a stream cannot be resumed in
  the middle of a message); none of the bytes it held were requests the daemon had
  started on;
- a message must arrive whole within ``limits.read_timeout_s`` of its first byte (timed
  while the daemon reads that connection and is not busy answering its earlier
  messages: the daemon's own slowness is not the client's): else ``timeout`` (rid nil)
  and close. A connection with no partial message is not timed out, nor one the client
  has half-closed (no byte can follow: its complete messages are answered, then it is
  closed).

So what clients can make the daemon hold is bounded whatever their number: the buffered
bytes (and the objects they decode to), plus a task, a decoder and one read per open
connection.

Stopping (SIGTERM, :meth:`Connections.stop`): nothing more is read from any connection;
every request already read is answered -- a signal whose commit was submitted gets its
real acknowledgement, a signal not yet submitted gets ``shutting_down`` (the daemon's
dispatch decides), queries are answered -- and then each connection is closed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..config import Limits
from ..protocol import FrameDecoder, ProtocolError, Request, error_reply, pack
from ..store.disk import human

log = logging.getLogger("gated")

#: A repeated warning about hostile or stuck clients is logged at most this often.
WARN_EVERY_S = 10.0

#: Linux >= 4.13; Python does not name it.
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)


@dataclass(frozen=True)
class Peer:
    """A connected client as the kernel saw it when it connected."""

    pid: int
    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    def gids(self) -> set[int]:
        return {self.gid, *self.groups}

    def __str__(self) -> str:
        return f"uid {self.uid} (gid {self.gid}, pid {self.pid})"


def peer_of(sock: socket.socket | None) -> Peer | None:
    """The peer's credentials of a connected Unix socket, or None where the platform
    does not say (then only open classes of ops are allowed)."""
    if sock is None:
        return None
    try:
        pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET,
                                                             socket.SO_PEERCRED,
                                                             struct.calcsize("3i")))
    except (OSError, AttributeError, struct.error):
        return None
    groups: tuple[int, ...] = ()
    try:  # Python's getsockopt reads at most 1024 bytes: 256 supplementary groups
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 1024)
        groups = struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4])
    except OSError:
        pass  # more groups than that (ERANGE), or a kernel before 4.13: the primary only
    return Peer(pid, uid, gid, tuple(groups))


class Connections:
    """Every open connection, and the bounds they share."""

    def __init__(self, limits: Limits, dispatch: Callable[[Request, Connection],
                                                          Awaitable[dict[str, Any]]],
                 metrics: Any) -> None:
        self.limits = limits
        self.dispatch = dispatch
        self.metrics = metrics
        self.open: set[Connection] = set()
        self.buffered = 0
        self.stopping = False
        self._all_closed = asyncio.Event()
        self._warned: dict[str, tuple[float, int]] = {}
        # Read at scrape time: nothing per request.
        metrics.connections.set_function(lambda: len(self.open))
        metrics.buffered_bytes.set_function(lambda: self.buffered)

    def protocol(self) -> Connection:
        """The protocol factory for ``loop.create_unix_server``."""
        return Connection(self)

    # --- accounting ---------------------------------------------------------------------------
    def _add(self, conn: Connection) -> None:
        self.open.add(conn)

    def _remove(self, conn: Connection) -> None:
        self.open.discard(conn)
        if self.stopping and not self.open:
            self._all_closed.set()

    def _hold(self, n: int) -> None:
        self.buffered += n

    def warn(self, reason: str, text: str) -> None:
        """A WARNING, at most one per reason every WARN_EVERY_S (with how many were not
        logged), so that a flood of hostile connections cannot flood the log."""
        now = time.monotonic()
        last, quiet = self._warned.get(reason, (0.0, 0))
        if now - last < WARN_EVERY_S:
            self._warned[reason] = (last, quiet + 1)
            return
        more = f" ({quiet} more like it in the last {now - last:.0f}s)" if quiet and last else ""
        log.warning("%s%s", text, more)
        self._warned[reason] = (now, 0)

    # --- stopping -----------------------------------------------------------------------------
    async def stop(self, timeout: float) -> int:
        """Read nothing more; answer every request already read; close every connection.
        Returns how many connections were still busy at ``timeout`` and were cut."""
        self.stopping = True
        if not self.open:
            return 0
        deadline = asyncio.get_running_loop().time() + timeout
        for conn in list(self.open):
            conn.stop_reading()
        tasks = [c.task for c in self.open if c.task is not None and not c.task.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, deadline -
                                                   asyncio.get_running_loop().time()))
        if self.open:  # answered; their last replies are being flushed
            try:
                await asyncio.wait_for(self._all_closed.wait(), max(
                    0.0, deadline - asyncio.get_running_loop().time()))
            except TimeoutError:
                pass
        cut = len(self.open)
        for conn in list(self.open):
            conn.abort()
        return cut


class Connection(asyncio.Protocol):
    """One client connection: decode, answer in order, stay within the shared bounds."""

    def __init__(self, hub: Connections) -> None:
        self.hub = hub
        self.decoder = FrameDecoder(hub.limits)
        self.items: deque[Request | ProtocolError] = deque()
        self.held = 0                  # bytes received and not yet answered
        self.peer: Peer | None = None
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task | None = None
        self.refused: set[str] = set()  # op classes refused once (logged once)
        self._wake = asyncio.Event()
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._timer: asyncio.TimerHandle | None = None
        self._reading = True
        self._busy = False   # requests read and not all answered yet
        self._done = False   # takes no more requests (closing)
        self._lost = False   # the transport is gone
        self._eof = False

    # --- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        hub = self.hub
        if hub.stopping or len(hub.open) >= hub.limits.max_connections:
            self._done = True
            if hub.stopping:
                reply = error_reply(None, "shutting_down", "the daemon is stopping; "
                                    "reconnect after it restarts")
            else:
                n = hub.limits.max_connections
                reply = error_reply(None, "overloaded", f"the daemon already serves {n} "
                                    "connections (limits.max_connections); closing this "
                                    "one: retry with backoff, or reuse an open connection")
                hub.metrics.dropped("max_connections")
                hub.metrics.rejected("overloaded")
                hub.warn("max_connections", f"refused a connection: {n} are open "
                         "(limits.max_connections)")
            transport.write(pack(reply))  # type: ignore[attr-defined]
            transport.close()
            return
        hub._add(self)
        self.peer = peer_of(transport.get_extra_info("socket"))
        self.task = asyncio.get_running_loop().create_task(self._serve())

    def data_received(self, data: bytes) -> None:
        if self._done:
            return
        hub, n = self.hub, len(data)
        if hub.buffered + n > hub.limits.max_buffered_bytes:
            cap = human(hub.limits.max_buffered_bytes)
            self._drop("buffered_bytes", "overloaded",
                       f"the daemon holds {human(hub.buffered)} of requests not yet answered "
                       f"across all connections and this read of {human(n)} would pass "
                       f"limits.max_buffered_bytes ({cap}); none of this connection's "
                       f"unanswered bytes ({human(self.held + n)}) were processed. Retry "
                       "with backoff")
            return
        self._hold(n)
        items = self.decoder.feed(data)
        if items:
            self.items.extend(items)
            if self._busy:  # a second read while the first is being answered: enough
                self._pause()
            self._busy = True
            self._wake.set()
            self._cancel_timer()  # a message completed: any tail is a new message
        if self.decoder.pending_bytes:
            self._arm_timer()

    def eof_received(self) -> bool:
        self._eof = True
        self._cancel_timer()  # nothing more can arrive: answer what is whole, then close
        self._wake.set()
        return True  # keep the transport: the replies to what was read still go out

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = self._done = True
        self._cancel_timer()
        self._can_write.set()
        self._wake.set()
        self.hub._remove(self)
        if self.task is None:  # refused at connection_made
            return
        if self.task.done():
            self._release(self.held)

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # --- serving -------------------------------------------------------------------------------
    async def _serve(self) -> None:
        hub = self.hub
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self.items and not self._lost:
                    item = self.items.popleft()
                    if isinstance(item, ProtocolError):
                        hub.metrics.rejected(item.code)
                        self._write(item.reply())
                        if item.fatal:
                            self._close()
                            return
                        continue
                    self._write(await hub.dispatch(item, self))
                    if not self._can_write.is_set():
                        await self._can_write.wait()
                if self._done:
                    return
                # Everything read is answered: only an incomplete tail stays held.
                self._release(self.held - self.decoder.pending_bytes)
                if self._eof or hub.stopping:
                    self._close()
                    return
                self._busy = False
                self._resume()
        except Exception:  # noqa: BLE001 - one connection's failure never takes the daemon
            log.exception("serving the connection of %s failed; closing it", self.peer)
            self.abort()
        finally:
            self._release(self.held)

    def stop_reading(self) -> None:
        """The daemon stops: read nothing more; answer what was read, then close."""
        self._pause()
        self._wake.set()

    def abort(self) -> None:
        self._done = True
        if self.transport is not None:
            self.transport.abort()

    # --- helpers -------------------------------------------------------------------------------
    def _write(self, reply: dict[str, Any]) -> None:
        if not self._lost and self.transport is not None:
            self.transport.write(pack(reply))

    def _close(self) -> None:
        self._done = True
        self._cancel_timer()
        if self.transport is not None:
            self.transport.close()  # after the replies written so far are flushed

    def _drop(self, reason: str, code: str, message: str) -> None:
        """Close this connection to stay within a bound, with one error reply (rid nil)."""
        hub = self.hub
        hub.metrics.dropped(reason)
        hub.metrics.rejected(code)
        hub.warn(reason, f"closed the connection of {self.peer}: {message}")
        self._write(error_reply(None, code, message + "; closing the connection"))
        self._close()
        self._release(self.held)
        self._wake.set()

    def _hold(self, n: int) -> None:
        self.held += n
        self.hub._hold(n)

    def _release(self, n: int) -> None:
        n = min(n, self.held)
        if n > 0:
            self.held -= n
            self.hub._hold(-n)

    def _pause(self) -> None:
        if self._reading:
            self._reading = False
            self._cancel_timer()
            if self.transport is not None and not self._lost:
                self.transport.pause_reading()

    def _resume(self) -> None:
        """Everything read is answered: read again (if paused), and time an incomplete
        tail from now on."""
        if not self._reading and not self._done:
            self._reading = True
            if self.transport is not None:
                self.transport.resume_reading()
        self._arm_timer()

    def _arm_timer(self) -> None:
        if self._timer is None and self._reading and not self._busy and not self._eof \
                and not self._done and self.decoder.pending_bytes:
            self._timer = asyncio.get_running_loop().call_later(
                self.hub.limits.read_timeout_s, self._timed_out)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        pending = self.decoder.pending_bytes
        if self._done or not pending:
            return
        self._drop("read_timeout", "timeout",
                   f"a message stayed incomplete for {self.hub.limits.read_timeout_s:g}s "
                   f"({human(pending)} of it received; limits.read_timeout_s): send each "
                   "message whole")
