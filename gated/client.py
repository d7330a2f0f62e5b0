"""A small synchronous client for the gated socket (used by the CLI, the demo and tests).

The wire format is a stream of msgpack maps (docs/protocol.md): every request carries an
`op` and a `rid`; every reply echoes the `rid`.
"""

from __future__ import annotations

import itertools
import socket
from typing import Any

import msgpack


class GatedError(RuntimeError):
    """The daemon answered ok: false."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class Client:
    def __init__(self, path: str, timeout: float = 30.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.unpacker = msgpack.Unpacker(raw=False, max_buffer_size=64 * 1024 * 1024)
        self._rids = itertools.count(1)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read_reply(self) -> dict:
        """The next reply on the stream; raises ConnectionError if the daemon closed it."""
        while True:
            for obj in self.unpacker:
                return obj
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the daemon closed the connection")
            self.unpacker.feed(chunk)

    def request(self, op: str, **fields: Any) -> dict:
        """Send one request and return its reply map (raises GatedError on ok: false)."""
        rid = next(self._rids)
        try:
            self.sock.sendall(msgpack.packb({"op": op, "rid": rid, **fields},
                                            use_bin_type=True))
        except (BrokenPipeError, ConnectionResetError) as exc:
            # The daemon may refuse a connection (overloaded, a hard limit) and close it
            # before our request arrives: its reason is already on the stream, so read it
            # and say that instead of "broken pipe".
            try:
                reply = self.read_reply()
            except (OSError, ValueError):
                raise ConnectionError(
                    f"the daemon closed the connection before {op!r} was sent") from exc
            err = reply.get("error") or {}
            raise GatedError(str(err.get("code")), str(err.get("message"))) from exc
        reply = self.read_reply()
        if reply.get("rid") is None and not reply.get("ok"):
            # a connection-level error (overloaded, timeout, a hard limit): rid nil, and
            # the daemon closes the connection
            err = reply.get("error") or {}
            raise GatedError(str(err.get("code")), str(err.get("message")))
        if reply.get("rid") != rid:
            raise RuntimeError(f"reply rid {reply.get('rid')!r} does not match request {rid}")
        if not reply.get("ok"):
            err = reply.get("error") or {}
            raise GatedError(str(err.get("code")), str(err.get("message")))
        return reply

    # --- the ops ----------------------------------------------------------------------
    def ping(self) -> dict:
        return self.request("ping")

    def signal(self, sig: dict) -> dict:
        """One signal; its fields travel inline in the request map, beside op and rid."""
        return self.request("signal", **sig)

    def signals(self, sigs: list[dict]) -> list[dict]:
        return self.request("signals", signals=sigs)["results"]

    def predict(self, context: str, history: list[str] | None = None) -> dict:
        return self.request("predict", context=context, **({"history": history} if history
                                                           else {}))

    def explain(self, context: str, history: list[str] | None = None) -> dict:
        return self.request("explain", context=context, **({"history": history} if history
                                                           else {}))

    def status(self) -> dict:
        return self.request("status")

    def rollback(self, to: int, pause: bool = False) -> dict:
        """Ask the daemon to republish kept version `to` (and pause training)."""
        return self.request("rollback", to=to, pause=pause)

    def resume(self) -> dict:
        return self.request("resume")
