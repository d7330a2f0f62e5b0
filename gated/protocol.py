"""The wire protocol: msgpack maps on a Unix stream socket (docs/protocol.md).

A connection carries a stream of msgpack maps in each direction, with no length prefix:
msgpack objects delimit themselves. Each request is ``{"op": str, "rid": any, ...}``; each
reply is ``{"rid": <echoed>, "ok": true, ...}`` or ``{"rid": ..., "ok": false, "error":
{"code": str, "message": str}}``.

Two kinds of limits protect the daemon from one bad client:

* **Hard limits** (the decoder's): message size, map and array lengths, ext size, a
  budget of decoded objects per message, and the decoder's own stack. Past one of them the
  decoder cannot know where the next message starts, so the connection is unusable: the
  server sends one error reply (``rid`` nil) and closes it. These limits bound the memory
  one connection can make the daemon allocate, whatever the bytes claim (a header that
  announces 2^31 elements is refused before anything is allocated).
* **Soft limits** (the request validator's): context and reason sizes, history length,
  batch size, nesting depth. A message that breaks one of them was decoded completely, so
  the stream is still in sync: the client gets an error reply with its ``rid`` and the
  connection stays open.

No I/O here: the server feeds received bytes to a :class:`FrameDecoder` and writes what
:func:`pack` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from .config import Limits

OPS = ("signal", "signals", "predict", "explain", "status", "ping", "rollback", "resume")

#: Every error code the daemon sends. Short snake_case strings, stable: clients and the
#: ``gated_signals_rejected_total{reason}`` metric rely on them.
ERROR_CODES = (
    "malformed",      # bytes that are not msgpack (fatal: the connection is closed)
    "not_a_map",      # a message (or a signals entry) that is not a map
    "missing_field",  # a required field is absent
    "wrong_type",     # a field has the wrong msgpack type
    "invalid_value",  # right type, value not allowed (e.g. decision "maybe", empty context)
    "unknown_field",  # a signal field the daemon does not know (a typo like "feedbak")
    "unknown_op",     # op is not one of OPS
    "too_large",      # a size or length limit was exceeded
    "too_deep",       # nesting deeper than Limits.max_depth
    "overloaded",     # the daemon cannot take more work now (a connection or buffer bound
                      # across connections); the connection is closed; retry with backoff
    "timeout",        # a message did not arrive whole within limits.read_timeout_s (closed)
    "forbidden",      # this client's user may not use this op ([access]); nothing was done
    "store_full",     # the disk or the LMDB map is full: nothing was stored; retry later
    "shutting_down",  # the daemon is draining for a stop; reconnect after restart
    "internal",       # a bug or an unexpected failure inside the daemon
)

#: Codes after which the decoder has lost the message boundaries.
FATAL_CODES = ("malformed", "too_large", "too_deep")


class ProtocolError(Exception):
    """A request the daemon will not serve, with the code and message the client gets.

    ``rid`` is the request's id when it could be read (None otherwise); ``fatal`` means
    the stream is out of sync and the server must close the connection after replying.
    """

    def __init__(self, code: str, message: str, *, rid: Any = None,
                 fatal: bool = False) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown protocol error code {code!r}")
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.rid, self.fatal = code, message, rid, fatal

    def as_dict(self) -> dict[str, str]:
        """The ``error`` map of a reply (also one entry of a ``signals`` result)."""
        return {"code": self.code, "message": self.message}

    def reply(self) -> dict[str, Any]:
        """The full error reply for this error."""
        return error_reply(self.rid, self.code, self.message)

    def __repr__(self) -> str:
        return (f"ProtocolError({self.code!r}, {self.message!r}, rid={self.rid!r}, "
                f"fatal={self.fatal})")


@dataclass(frozen=True, slots=True)
class Request:
    """A validated request.

    ``signal``: the signal's own fields (the request map without ``op`` and ``rid``;
    their content is checked by gated/signals.py). ``signals``: one entry per signal, in
    order, either the signal's map or a :class:`ProtocolError` for an entry that is not a
    map (it gets its own ``{"error": ...}`` result; the rest of the batch proceeds).
    ``context``/``history``: for predict and explain. ``args``: the checked fields of an
    operator op (rollback: ``to``, ``pause``).
    """

    op: str
    rid: Any = None
    signal: dict[str, Any] | None = None
    signals: list[dict[str, Any] | ProtocolError] | None = None
    context: str | None = None
    history: list[str] = field(default_factory=list)
    args: dict[str, Any] | None = None


# --- replies --------------------------------------------------------------------------

def ok_reply(rid: Any, **fields: Any) -> dict[str, Any]:
    """``{"rid": rid, "ok": True, **fields}``."""
    return {"rid": rid, "ok": True, **fields}


def error_reply(rid: Any, code: str, message: str) -> dict[str, Any]:
    """``{"rid": rid, "ok": False, "error": {"code": code, "message": message}}``.

    ``code`` should be one of :data:`ERROR_CODES`; this does not raise on another one,
    because failing while reporting a failure would cost the client its answer (the
    metrics count unknown codes as ``other``; tests keep the vocabulary closed).
    """
    return {"rid": rid, "ok": False, "error": {"code": str(code), "message": str(message)}}


def _default(obj: Any) -> Any:
    """Pack numpy/cupy scalars and arrays that replies may carry (p_allow, ...)."""
    item = getattr(obj, "item", None)
    if callable(item) and getattr(obj, "shape", None) == ():
        return item()
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        return tolist()
    raise TypeError(f"cannot msgpack {type(obj).__name__}")


def pack(obj: Any) -> bytes:
    """One message as bytes (str as msgpack str, bytes as bin, numpy scalars as numbers)."""
    return msgpack.packb(obj, use_bin_type=True, default=_default)


# --- decoding -------------------------------------------------------------------------

class _ItemBudget:
    """Counts decoded containers and their elements; raises past ``limit``.

    msgpack has no object-count limit, so this rides on ``list_hook``/``object_hook``,
    which the C decoder calls once per finished array/map. The count is reset only when a
    whole message has been decoded, so a message split across reads is counted once.
    The map hook also refuses a map key that is not a str (see :func:`check_map_keys`).
    """

    __slots__ = ("limit", "left")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit

    def reset(self) -> None:
        self.left = self.limit

    def hook(self, obj: Any) -> Any:
        self.left -= 1 + len(obj)
        if self.left < 0:
            raise _TooManyItems(f"a message decodes to more than {self.limit} objects")
        return obj

    def map_hook(self, obj: dict) -> dict:
        check_map_keys(obj)
        return self.hook(obj)


class _TooManyItems(ValueError):
    pass


class _NonStrKey(ValueError):
    pass


def check_map_keys(obj: dict) -> dict:
    """Refuse a decoded map whose keys are not all str (an ``object_hook``).

    ``strict_map_key`` lets str AND bin keys through; docs/protocol.md says map keys are
    str, and a bin ``b"op"`` is not the key ``"op"``, so a bin key is malformed too.
    """
    for k in obj:
        if type(k) is not str:
            raise _NonStrKey(f"a map key is {_typename(k)} ({k!r:.40}), not str: map keys "
                             "must be msgpack str (pack with use_bin_type=True, keys as "
                             "text)")
    return obj


def make_unpacker(limits: Limits | None = None, *,
                  budget: _ItemBudget | None = None) -> msgpack.Unpacker:
    """A ``msgpack.Unpacker`` with every limit set explicitly (see :class:`Limits`).

    Strings and bins may be as large as a message (the message-size check bounds them;
    field sizes are soft limits checked after decoding, so an oversize context gets a clear
    reply instead of a closed connection). Array and map lengths are checked at the
    header, before msgpack preallocates the container. Map keys must be str
    (``strict_map_key`` refuses other types, :func:`check_map_keys` bin); str must be
    valid UTF-8 (``raw=False``). Nesting: msgpack's C
    decoder refuses more than 1024 levels (``StackError``); shallower excess is caught by
    :func:`depth_exceeds`.
    """
    lim = limits or Limits()
    hooks: dict[str, Any] = {"object_hook": check_map_keys}
    if budget is not None:
        hooks = {"list_hook": budget.hook, "object_hook": budget.map_hook}
    return msgpack.Unpacker(
        raw=False,
        strict_map_key=True,
        use_list=True,
        max_buffer_size=lim.max_message_bytes,
        max_str_len=lim.max_message_bytes,
        max_bin_len=lim.max_message_bytes,
        max_array_len=lim.max_array_len,
        max_map_len=lim.max_map_len,
        max_ext_len=lim.max_ext_bytes,
        **hooks,
    )


def depth_exceeds(obj: Any, max_depth: int) -> bool:
    """True when ``obj`` nests containers deeper than ``max_depth`` (a scalar is 0).

    Iterative, and it only walks containers, so a batch of 4096 flat signals costs a few
    milliseconds.
    """
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            children = o.values()
        elif isinstance(o, list):
            children = o
        else:
            continue
        d += 1
        if d > max_depth:
            return True
        for c in children:
            if isinstance(c, (dict, list)):
                stack.append((c, d))
    return False


class FrameDecoder:
    """Turns the bytes of one connection into requests, errors, and a verdict.

    ``feed(data)`` returns, in stream order, a :class:`Request` for each valid message and
    a :class:`ProtocolError` for each invalid one. A non-fatal error keeps the stream in
    sync (answer it and go on); a fatal one is always the last item, after which the
    decoder is ``closed`` and ignores further input: send its reply and close the
    connection. Requests that arrived before the garbage are still returned, so a client
    that pipelines gets its earlier answers.
    """

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._budget = _ItemBudget(self.limits.max_items)
        self._unpacker = make_unpacker(self.limits, budget=self._budget)
        self._fed = 0        # bytes fed to the unpacker so far
        self._boundary = 0   # stream offset just after the last complete message
        self.closed = False

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete message received so far (0 at a message boundary)."""
        return self._fed - self._boundary

    def feed(self, data: bytes) -> list[Request | ProtocolError]:
        out: list[Request | ProtocolError] = []
        if self.closed:
            return out
        view = memoryview(data)
        cap = self.limits.max_message_bytes
        while True:
            # Feed no more than the current message may still grow by, so neither the
            # unpacker's buffer nor a message's size can pass max_message_bytes.
            room = cap - self.pending_bytes
            if room <= 0:
                return self._fatal(out, "too_large",
                                   f"a message exceeds {cap} bytes (max_message_bytes); "
                                   "split the batch or shorten the fields")
            piece, view = view[:room], view[room:]
            if piece:
                self._unpacker.feed(piece)
                self._fed += len(piece)
            if not self._drain(out):
                return out
            if not view:
                return out

    def _drain(self, out: list[Request | ProtocolError]) -> bool:
        """Decode every complete message buffered; False after a fatal error."""
        while True:
            try:
                obj = self._unpacker.unpack()
            except msgpack.OutOfData:
                return True
            except msgpack.StackError:
                self._fatal(out, "too_deep", "nesting exceeds the decoder's stack (1024 "
                                             f"levels; requests may nest "
                                             f"{self.limits.max_depth})")
                return False
            except _TooManyItems as e:
                self._fatal(out, "too_large", f"{e} (max_items); split the batch")
                return False
            except _NonStrKey as e:
                self._fatal(out, "malformed", str(e))
                return False
            except msgpack.BufferFull:  # cannot happen: feed() never overfills
                self._fatal(out, "too_large", f"a message exceeds "
                                              f"{self.limits.max_message_bytes} bytes")
                return False
            except UnicodeDecodeError as e:
                self._fatal(out, "malformed", f"a string is not valid UTF-8 ({e.reason} at "
                                              f"byte {e.start}); send text as UTF-8 str")
                return False
            except (msgpack.FormatError, msgpack.ExtraData) as e:
                what = str(e) or "a reserved type byte"
                self._fatal(out, "malformed", f"the bytes are not msgpack ({what}); the "
                                              "stream cannot be resynchronised")
                return False
            except ValueError as e:
                msg = str(e)
                code = "too_large" if "exceeds max_" in msg else "malformed"
                self._fatal(out, code, f"undecodable message: {msg}")
                return False
            except Exception as e:  # noqa: BLE001 - any decoder failure ends this stream
                self._fatal(out, "malformed", f"undecodable message: "
                                              f"{type(e).__name__}: {e}")
                return False
            self._boundary = self._unpacker.tell()
            self._budget.reset()
            try:
                out.append(validate_request(obj, self.limits))
            except ProtocolError as e:
                out.append(e)

    def _fatal(self, out: list[Request | ProtocolError], code: str,
               message: str) -> list[Request | ProtocolError]:
        self.closed = True
        out.append(ProtocolError(code, message + "; closing the connection", fatal=True))
        return out


# --- validation -----------------------------------------------------------------------

def _typename(v: Any) -> str:
    return {dict: "map", list: "array", str: "str", bytes: "bin", int: "int",
            float: "float", bool: "bool", type(None): "nil"}.get(type(v), type(v).__name__)


def _utf8_len_over(s: str, limit: int) -> bool:
    """len(s.encode()) > limit, without encoding when the character count decides it."""
    if len(s) > limit:
        return True
    if len(s) * 4 <= limit:
        return False
    return len(s.encode("utf-8", "surrogatepass")) > limit


def _check_text(req: dict, key: str, rid: Any, limits: Limits, *,
                required: bool) -> str | None:
    if key not in req:
        if required:
            raise ProtocolError("missing_field", f"{req['op']} needs {key!r} (a str)", rid=rid)
        return None
    v = req[key]
    if not isinstance(v, str):
        raise ProtocolError("wrong_type", f"{key!r} must be a str, got {_typename(v)}",
                            rid=rid)
    if _utf8_len_over(v, limits.max_context_bytes):
        raise ProtocolError("too_large", f"{key!r} is longer than "
                                         f"{limits.max_context_bytes} UTF-8 bytes", rid=rid)
    return v


def _check_history(req: dict, rid: Any, limits: Limits) -> list[str]:
    h = req.get("history")
    if h is None:
        return []
    if not isinstance(h, list):
        raise ProtocolError("wrong_type", f"'history' must be an array of str, got "
                                          f"{_typename(h)}", rid=rid)
    if len(h) > limits.max_history:
        raise ProtocolError("too_large", f"'history' has {len(h)} entries; at most "
                                         f"{limits.max_history} (keep the most recent)",
                            rid=rid)
    for i, item in enumerate(h):
        if not isinstance(item, str):
            raise ProtocolError("wrong_type", f"history[{i}] must be a str, got "
                                              f"{_typename(item)}", rid=rid)
        if _utf8_len_over(item, limits.max_context_bytes):
            raise ProtocolError("too_large", f"history[{i}] is longer than "
                                             f"{limits.max_context_bytes} UTF-8 bytes",
                                rid=rid)
    return h


def validate_request(obj: Any, limits: Limits | None = None) -> Request:
    """Check a decoded message's shape and return it as a :class:`Request`.

    Raises :class:`ProtocolError` (never fatal: the message was decoded whole). Unknown
    extra fields are ignored, so newer clients can talk to older daemons; for ``signal``
    every field besides ``op`` and ``rid`` is the signal and is passed on unchanged.
    A missing ``rid`` is answered with ``rid`` nil.
    """
    lim = limits or Limits()
    if not isinstance(obj, dict):
        raise ProtocolError("not_a_map", f"a request must be a map, got {_typename(obj)}")
    rid = obj.get("rid")
    if depth_exceeds(obj, lim.max_depth):
        if depth_exceeds(rid, lim.max_depth - 1):
            rid = None
        raise ProtocolError("too_deep", f"the request nests deeper than {lim.max_depth} "
                                        "levels", rid=rid)
    if "op" not in obj:
        raise ProtocolError("missing_field", f"a request needs 'op' (one of "
                                             f"{', '.join(OPS)})", rid=rid)
    op = obj["op"]
    if not isinstance(op, str):
        raise ProtocolError("wrong_type", f"'op' must be a str, got {_typename(op)}", rid=rid)
    if op not in OPS:
        raise ProtocolError("unknown_op", f"unknown op {op[:64]!r}; ops are "
                                          f"{', '.join(OPS)}", rid=rid)
    if op in ("ping", "status", "resume"):
        return Request(op=op, rid=rid)
    if op == "rollback":
        to = obj.get("to")
        if not isinstance(to, int) or isinstance(to, bool) or to < 1:
            raise ProtocolError("missing_field" if to is None else "wrong_type",
                                "rollback needs 'to': a kept published version (int >= 1)",
                                rid=rid)
        pause = obj.get("pause", False)
        if not isinstance(pause, bool):
            raise ProtocolError("wrong_type", "'pause' must be a bool", rid=rid)
        return Request(op=op, rid=rid, args={"to": to, "pause": pause})
    if op in ("predict", "explain"):
        context = _check_text(obj, "context", rid, lim, required=True)
        return Request(op=op, rid=rid, context=context, history=_check_history(obj, rid, lim))
    if op == "signal":
        return Request(op=op, rid=rid,
                       signal={k: v for k, v in obj.items() if k != "op" and k != "rid"})
    # op == "signals"
    if "signals" not in obj:
        raise ProtocolError("missing_field", "signals needs 'signals' (an array of signal "
                                             "maps)", rid=rid)
    batch = obj["signals"]
    if not isinstance(batch, list):
        raise ProtocolError("wrong_type", f"'signals' must be an array of maps, got "
                                          f"{_typename(batch)}", rid=rid)
    if len(batch) > lim.max_batch:
        raise ProtocolError("too_large", f"'signals' has {len(batch)} entries; at most "
                                         f"{lim.max_batch} per request: split the batch",
                            rid=rid)
    entries: list[dict[str, Any] | ProtocolError] = [
        s if isinstance(s, dict) else
        ProtocolError("not_a_map", f"signals[{i}] must be a map, got {_typename(s)}", rid=rid)
        for i, s in enumerate(batch)
    ]
    return Request(op=op, rid=rid, signals=entries)
