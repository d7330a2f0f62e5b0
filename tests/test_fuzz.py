"""Property-based fuzzing of the wire decoder and the daemon's dispatcher (hypothesis).

Two layers, both real:

- the decoder (:class:`gated.protocol.FrameDecoder`) on arbitrary bytes, arbitrary
  msgpack values, mutated valid frames and arbitrary splits of a stream: it never
  raises, reports at most one fatal error and only as its last item, never holds more
  than ``max_message_bytes`` of a message, and decodes a stream the same however it is
  cut;
- the dispatcher, through a real `gated run` process on its real socket: generated
  requests (every op, right and wrong field types, hostile values) each get exactly one
  reply that echoes the rid, with an ok flag or an error code from the protocol's list,
  and never `internal`; generated hostile byte strings get error replies and a close, or
  nothing (an incomplete message times out); the daemon stays up, answers a ping after
  each, and logs no traceback.

The example counts are fixed and the generation derandomized, so `make test` runs the
same cases every time in about half a minute; bench/bench_fuzz.py is the long run
(100,000 frames, many connections, RSS sampled).
"""

from __future__ import annotations

import socket
import time

import msgpack
import pytest
from daemon_proc import start
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gated.protocol import ERROR_CODES, OPS, FrameDecoder, Limits, ProtocolError, Request

pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

FAST = settings(max_examples=400, deadline=None, derandomize=True, database=None)
SOCKET = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture,
                                         HealthCheck.too_slow])

# --- strategies -----------------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.binary(max_size=40))
keys = st.one_of(st.text(max_size=12), st.binary(max_size=4))  # bin keys are malformed
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.dictionaries(keys, inner, max_size=6)), max_leaves=24)
texts = st.one_of(st.text(max_size=80), st.sampled_from(
    ["", " ", "shell.exec rm -rf /", "é" * 40, "\x00", "x" * 70000]))


def signal_maps() -> st.SearchStrategy:
    return st.fixed_dictionaries({}, optional={
        "context": st.one_of(texts, values),
        "decision": st.one_of(st.sampled_from(["allow", "block", "maybe", ""]), values),
        "history": st.one_of(st.lists(texts, max_size=20), values),
        "feedback": st.one_of(st.sampled_from(["confirm", "override_allow",
                                               "override_block", "false_positive",
                                               "false_negative", "nope"]), values),
        "reason": st.one_of(texts, values),
        "id": st.one_of(st.text(max_size=200), values),
        "ts": st.one_of(st.floats(allow_nan=True), values),
        "feedbak": values,
    })


requests = st.fixed_dictionaries(
    {"op": st.one_of(st.sampled_from([*OPS, "launch", ""]), values)},
    optional={
        "rid": values,
        "context": st.one_of(texts, values),
        "history": st.one_of(st.lists(texts, max_size=20), values),
        "signals": st.one_of(st.lists(signal_maps(), max_size=8), values),
        "to": st.one_of(st.integers(-5, 10**6), values),
        "pause": values,
        "decision": st.sampled_from(["allow", "block"]),
    }).map(lambda r: r if r.get("op") != "signal" else {**r, "context": r.get("context",
                                                                               "ls")})


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def has_bin_key(obj) -> bool:
    if isinstance(obj, dict):
        return any(isinstance(k, bytes) or has_bin_key(v) for k, v in obj.items())
    if isinstance(obj, list):
        return any(has_bin_key(v) for v in obj)
    return False


def valid_frames() -> st.SearchStrategy:
    return st.lists(st.sampled_from([
        {"op": "ping", "rid": 1},
        {"op": "predict", "rid": "p", "context": "ls -la", "history": ["cd /"]},
        {"op": "signal", "rid": [1, 2], "context": "rm", "decision": "block"},
        {"op": "signals", "rid": None, "signals": [{"context": "x", "decision": "allow"}]},
        {"op": "status"},
    ]), min_size=1, max_size=6).map(lambda msgs: b"".join(pack(m) for m in msgs))


# --- the decoder ------------------------------------------------------------------------------

def check_items(dec: FrameDecoder, items: list) -> None:
    assert all(isinstance(i, (Request, ProtocolError)) for i in items)
    fatal = [i for i in items if isinstance(i, ProtocolError) and i.fatal]
    assert len(fatal) <= 1 and (not fatal or items[-1] is fatal[0])
    for i in items:
        if isinstance(i, ProtocolError):
            assert i.code in ERROR_CODES and i.message
    assert dec.pending_bytes <= dec.limits.max_message_bytes
    if fatal:
        assert dec.closed and dec.feed(pack({"op": "ping"})) == []


@FAST
@given(st.binary(max_size=4096))
def test_arbitrary_bytes_never_raise(data):
    dec = FrameDecoder(Limits(max_message_bytes=2048))
    check_items(dec, dec.feed(data))


@FAST
@given(values)
def test_arbitrary_values_decode_to_a_request_or_a_clear_error(obj):
    dec = FrameDecoder()
    items = dec.feed(pack(obj))
    check_items(dec, items)
    assert len(items) == 1
    if isinstance(obj, dict) and obj.get("op") in ("ping", "status") \
            and all(isinstance(k, str) for k in obj):
        item = items[0]
        assert isinstance(item, Request) or item.code == "too_deep", item


@FAST
@given(requests)
def test_generated_requests_decode_without_a_fatal_error(req):
    dec = FrameDecoder()
    items = dec.feed(pack(req))
    check_items(dec, items)
    (item,) = items
    if has_bin_key(req):  # docs/protocol.md: map keys are str; anything else is malformed
        assert isinstance(item, ProtocolError) and item.fatal and item.code == "malformed"
    elif isinstance(item, ProtocolError):
        assert not item.fatal, item


@FAST
@given(valid_frames(), st.lists(st.integers(0, 10**6), max_size=8))
def test_a_stream_decodes_the_same_however_it_is_cut(stream, cuts):
    whole = FrameDecoder().feed(stream)
    dec = FrameDecoder()
    got: list = []
    points = sorted({c % (len(stream) + 1) for c in cuts})
    for a, b in zip([0, *points], [*points, len(stream)], strict=True):
        got += dec.feed(stream[a:b])
    assert [repr(i) for i in got] == [repr(i) for i in whole]
    assert dec.pending_bytes == 0


@FAST
@given(valid_frames(), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255),
                                          st.sampled_from(["flip", "insert", "delete"])),
                                min_size=1, max_size=6))
def test_mutated_frames_never_raise(stream, edits):
    data = bytearray(stream)
    for pos, byte, how in edits:
        i = pos % (len(data) + 1)
        if how == "insert" or not data:
            data[i:i] = bytes([byte])
        elif how == "delete":
            del data[min(i, len(data) - 1)]
        else:
            data[min(i, len(data) - 1)] = byte
    dec = FrameDecoder()
    check_items(dec, dec.feed(bytes(data)))


# --- the dispatcher, through a real daemon ---------------------------------------------------

READ_TIMEOUT_S = 0.5

CONFIG = f"""
[limits]
read_timeout_s = {READ_TIMEOUT_S}
[train]
idle_steps_per_second = 0.0
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    cfg = tmp / "gated.toml"
    cfg.write_text(CONFIG)
    d = start(tmp, config=cfg)
    yield d
    code = d.stop()
    log = d.log()
    assert code == 0, log
    assert "Traceback" not in log and "failed; closing it" not in log, log


class Conn:
    def __init__(self, path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(15)
        self.sock.connect(str(path))
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)

    def send(self, data: bytes) -> bool:
        """False when the daemon closed the connection before taking all of it (after a
        hard limit, a fatal error)."""
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def reply(self) -> dict | None:
        """The next reply; None if the daemon closed the connection first."""
        while True:
            for reply in self.unpacker:
                return reply
            try:
                chunk = self.sock.recv(1 << 16)
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            self.unpacker.feed(chunk)


def check_reply(reply: dict) -> None:
    assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), reply
    if not reply["ok"]:
        code = reply["error"]["code"]
        assert code in ERROR_CODES and reply["error"]["message"], reply
        assert code != "internal", reply


@SOCKET
@given(req=requests)
def test_every_generated_request_gets_one_clear_reply(daemon, req):
    conn = Conn(daemon.sock)
    try:
        data = pack(req)
        sent = conn.send(data + pack({"op": "ping", "rid": "after"}))
        reply = conn.reply()
        assert reply is not None, ("no reply", len(data), sent)
        check_reply(reply)
        fatal = not reply["ok"] and "closing the connection" in reply["error"]["message"]
        if fatal:  # a bin map key (malformed) or a hard limit: the connection closes
            assert reply["rid"] is None, reply
            assert has_bin_key(req) or reply["error"]["code"] in ("too_large", "too_deep")
            assert reply["error"]["code"] != "malformed" or has_bin_key(req), (req, reply)
            assert conn.reply() is None
            return
        assert sent and not has_bin_key(req), (req, reply)
        if reply["ok"] or reply["error"]["code"] != "too_deep":
            assert pack(reply["rid"]) == pack(req.get("rid")), (req, reply)
        # still in sync: the ping sent behind it is answered on the same connection
        after = conn.reply()
        assert after is not None and after["rid"] == "after" and after["ok"] is True, after
    finally:
        conn.sock.close()


def _send_and_collect(path, data: bytes, *, half_close: bool) -> tuple[list, bool]:
    """Send ``data``; the replies until the daemon closes the connection (or 2 s)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(READ_TIMEOUT_S * 4)
    s.connect(str(path))
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    replies, closed = [], False
    try:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + READ_TIMEOUT_S * 4
        while time.monotonic() < deadline:
            chunk = s.recv(1 << 16)
            if not chunk:
                closed = True
                break
            unpacker.feed(chunk)
            replies.extend(unpacker)
    except (BrokenPipeError, ConnectionResetError):
        closed = True
    except TimeoutError:
        pass
    finally:
        s.close()
    for r in replies:
        check_reply(r)
    return replies, closed


@SOCKET
@given(data=st.binary(max_size=2048))
def test_hostile_bytes_get_clear_errors_and_the_daemon_stays_up(daemon, data):
    """Arbitrary bytes, then the client's end closed: every whole message is answered
    (with clear errors), the connection is closed, nothing else is affected."""
    replies, closed = _send_and_collect(daemon.sock, data, half_close=True)
    assert closed, (data[:64], replies)
    with daemon.client(timeout=10) as c:
        assert c.ping()["pong"] is True


@settings(SOCKET, max_examples=25)
@given(data=valid_frames().flatmap(
    lambda s: st.integers(1, len(s) - 1).map(lambda n: s[:n])))
def test_an_unfinished_message_is_answered_by_a_timeout(daemon, data):
    """A stream cut inside a message and left open: the whole messages before the cut
    are answered, then `timeout` (rid nil) closes it."""
    replies, closed = _send_and_collect(daemon.sock, data, half_close=False)
    dec = FrameDecoder()
    whole = dec.feed(data)
    if dec.pending_bytes:
        assert closed and replies and replies[-1]["error"]["code"] == "timeout", replies
        assert len(replies) == len(whole) + 1
    else:  # the cut fell between two messages: answered, and the connection stays
        assert len(replies) == len(whole) and not closed
    with daemon.client(timeout=10) as c:
        assert c.ping()["pong"] is True
