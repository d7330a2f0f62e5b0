"""The wire protocol: framing, hard and soft limits, request validation, replies.

Everything here runs on bytes (no socket): the server is a thin loop around
FrameDecoder.feed, so what the decoder does with hostile bytes is what a client sees.
"""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import msgpack
import numpy as np
import pytest

from gated.protocol import (
    ERROR_CODES,
    FATAL_CODES,
    OPS,
    FrameDecoder,
    Limits,
    ProtocolError,
    Request,
    depth_exceeds,
    error_reply,
    make_unpacker,
    ok_reply,
    pack,
    validate_request,
)

SIGNAL = {"context": "shell.exec {\"cmd\": \"ls -la\"}", "decision": "allow",
          "history": ["fs.read {\"path\": \"/etc/hosts\"}"], "reason": "read-only listing",
          "id": "sig-1", "ts": 1.7e9}


def one(dec: FrameDecoder, data: bytes) -> Request | ProtocolError:
    items = dec.feed(data)
    assert len(items) == 1, items
    return items[0]


def err(dec: FrameDecoder, data: bytes) -> ProtocolError:
    item = one(dec, data)
    assert isinstance(item, ProtocolError), item
    return item


# --- valid requests -------------------------------------------------------------------

def test_every_op_decodes_to_a_request():
    dec = FrameDecoder()
    msgs = [
        {"op": "ping", "rid": 1},
        {"op": "status", "rid": "two"},
        {"op": "predict", "rid": 3, "context": "c", "history": ["a", "b"]},
        {"op": "explain", "rid": [4, "x"], "context": "c"},
        {"op": "signal", "rid": 5, **SIGNAL},
        {"op": "signals", "rid": None, "signals": [SIGNAL, SIGNAL]},
        {"op": "rollback", "rid": 6, "to": 3},
        {"op": "rollback", "rid": 7, "to": 2, "pause": True},
        {"op": "resume", "rid": 8},
    ]
    items = dec.feed(b"".join(pack(m) for m in msgs))
    assert [i.op for i in items] == ["ping", "status", "predict", "explain", "signal", "signals",
                                     "rollback", "rollback", "resume"]
    assert all(isinstance(i, Request) for i in items)
    assert [i.rid for i in items] == [1, "two", 3, [4, "x"], 5, None, 6, 7, 8]
    assert items[6].args == {"to": 3, "pause": False} and items[7].args == {"to": 2,
                                                                              "pause": True}
    assert items[2].context == "c" and items[2].history == ["a", "b"]
    assert items[3].history == []
    assert items[4].signal == SIGNAL  # op and rid stripped, everything else passed on
    assert items[5].signals == [SIGNAL, SIGNAL]
    assert dec.pending_bytes == 0 and not dec.closed
    assert set(OPS) == {"signal", "signals", "predict", "explain", "status", "ping",
                        "rollback", "resume"}


@pytest.mark.parametrize("msg,code", [
    ({"op": "rollback", "rid": 1}, "missing_field"),
    ({"op": "rollback", "rid": 1, "to": "3"}, "wrong_type"),
    ({"op": "rollback", "rid": 1, "to": 0}, "wrong_type"),
    ({"op": "rollback", "rid": 1, "to": True}, "wrong_type"),
    ({"op": "rollback", "rid": 1, "to": 2, "pause": "yes"}, "wrong_type"),
])
def test_rollback_needs_a_version_and_a_bool_pause(msg, code):
    (item,) = FrameDecoder().feed(pack(msg))
    assert isinstance(item, ProtocolError) and item.code == code and item.rid == 1


def test_a_good_frame_split_byte_by_byte():
    dec = FrameDecoder()
    data = pack({"op": "signals", "rid": 7, "signals": [SIGNAL] * 3}) + pack({"op": "ping"})
    got = []
    for i in range(len(data)):
        got += dec.feed(data[i:i + 1])
        if i < len(data) - 4:
            assert len(got) <= 1
    assert [g.op for g in got] == ["signals", "ping"]
    assert got[0].rid == 7 and len(got[0].signals) == 3
    assert got[1].rid is None  # a missing rid is answered with nil


def test_truncated_frame_waits_then_completes():
    dec = FrameDecoder()
    data = pack({"op": "predict", "rid": 1, "context": "x" * 1000})
    assert dec.feed(data[:500]) == []
    assert dec.pending_bytes == 500 and not dec.closed
    (req,) = dec.feed(data[500:])
    assert req.context == "x" * 1000 and dec.pending_bytes == 0


def test_ext_rid_is_echoed():
    rid = msgpack.ExtType(5, b"abc")
    req = one(FrameDecoder(), pack({"op": "ping", "rid": rid}))
    assert req.rid == rid
    assert msgpack.unpackb(pack(ok_reply(req.rid)), raw=False)["rid"] == rid


# --- soft errors: a reply with the rid, the connection stays ---------------------------

@pytest.mark.parametrize("msg, code", [
    (7, "not_a_map"),
    ([1, 2], "not_a_map"),
    ({"rid": 1}, "missing_field"),
    ({"op": 3, "rid": 1}, "wrong_type"),
    ({"op": "launch", "rid": 1}, "unknown_op"),
    ({"op": "predict", "rid": 1}, "missing_field"),
    ({"op": "predict", "rid": 1, "context": 5}, "wrong_type"),
    ({"op": "predict", "rid": 1, "context": b"bytes"}, "wrong_type"),
    ({"op": "explain", "rid": 1, "context": "c", "history": "a"}, "wrong_type"),
    ({"op": "explain", "rid": 1, "context": "c", "history": ["a", 2]}, "wrong_type"),
    ({"op": "predict", "rid": 1, "context": "c", "history": ["h"] * 17}, "too_large"),
    ({"op": "predict", "rid": 1, "context": "x" * (64 * 1024 + 1)}, "too_large"),
    ({"op": "predict", "rid": 1, "context": "é" * 40000}, "too_large"),  # 80000 bytes
    ({"op": "predict", "rid": 1, "context": "c", "history": ["x" * 70000]}, "too_large"),
    ({"op": "signals", "rid": 1}, "missing_field"),
    ({"op": "signals", "rid": 1, "signals": {"a": 1}}, "wrong_type"),
    ({"op": "signals", "rid": 1, "signals": [SIGNAL] * 4097}, "too_large"),
])
def test_invalid_requests_get_a_clear_error_and_the_stream_continues(msg, code):
    dec = FrameDecoder()
    items = dec.feed(pack(msg) + pack({"op": "ping", "rid": 99}))
    assert len(items) == 2
    e, ping = items
    assert isinstance(e, ProtocolError) and e.code == code and not e.fatal
    assert e.message and len(e.message) < 300
    assert e.rid == (msg.get("rid") if isinstance(msg, dict) else None)
    assert isinstance(ping, Request) and ping.rid == 99
    assert not dec.closed
    reply = msgpack.unpackb(pack(e.reply()), raw=False)
    assert reply == {"rid": e.rid, "ok": False, "error": {"code": code, "message": e.message}}


def test_multibyte_context_within_the_byte_limit_is_accepted():
    req = one(FrameDecoder(), pack({"op": "predict", "context": "é" * 30000}))  # 60000 B
    assert isinstance(req, Request)


def test_a_non_map_entry_in_a_batch_is_an_error_for_that_entry_only():
    req = one(FrameDecoder(), pack({"op": "signals", "rid": 1, "signals": [SIGNAL, 3, SIGNAL]}))
    assert isinstance(req, Request)
    assert req.signals[0] == SIGNAL and req.signals[2] == SIGNAL
    assert isinstance(req.signals[1], ProtocolError) and req.signals[1].code == "not_a_map"
    assert "signals[1]" in req.signals[1].message


def test_moderately_deep_nesting_is_refused_with_the_rid():
    deep: object = "leaf"
    for _ in range(20):
        deep = [deep]
    dec = FrameDecoder()
    e = err(dec, pack({"op": "ping", "rid": 5, "extra": deep}))
    assert e.code == "too_deep" and e.rid == 5 and not e.fatal
    # a deep rid is not echoed
    e = err(dec, pack({"op": "ping", "rid": deep}))
    assert e.code == "too_deep" and e.rid is None
    assert isinstance(one(dec, pack({"op": "ping"})), Request)


def test_depth_exceeds():
    assert not depth_exceeds(1, 0)
    assert not depth_exceeds({"a": [1]}, 2)
    assert depth_exceeds({"a": [1]}, 1)
    assert depth_exceeds([[[[]]]], 3) and not depth_exceeds([[[[]]]], 4)


# --- fatal errors: one reply (rid nil), then the connection closes ---------------------

def assert_fatal(items, code):
    assert items, "expected a fatal error"
    e = items[-1]
    assert isinstance(e, ProtocolError) and e.fatal and e.code == code, e
    assert e.rid is None and "closing the connection" in e.message
    assert all(not getattr(i, "fatal", False) for i in items[:-1])
    assert code in FATAL_CODES


def test_requests_before_garbage_are_still_returned():
    dec = FrameDecoder()
    items = dec.feed(pack({"op": "ping", "rid": 1}) + b"\xc1garbage")
    assert isinstance(items[0], Request) and items[0].rid == 1
    assert_fatal(items, "malformed")
    assert dec.closed
    assert dec.feed(pack({"op": "ping"})) == []  # closed decoders ignore input


@pytest.mark.parametrize("data, code", [
    (b"\xc1", "malformed"),                                # reserved type byte
    (b"\x81\x01\x02", "malformed"),                        # int map key (strict_map_key)
    (b"\x81\xc4\x02op\xa4ping", "malformed"),               # bin map key: {b"op": "ping"}
    (b"\x81\xa2op\xa2\xff\xfe", "malformed"),              # invalid UTF-8 in a str
    (b"\xdd\x80\x00\x00\x00", "too_large"),                # array32 claiming 2^31 elements
    (b"\xdf\x80\x00\x00\x00", "too_large"),                # map32 claiming 2^31 entries
    (b"\xdc\xff\xff", "too_large"),                        # array16: 65535 > max_array_len
    (b"\xde\x01\x00", "too_large"),                        # map16: 256 > max_map_len
    (b"\xc9\x00\x01\x00\x00\x05" + bytes(65536), "too_large"),  # ext32 of 64 KiB
    (b"\x91" * 5000, "too_deep"),                          # beyond msgpack's 1024-level stack
])
def test_hostile_bytes_close_the_connection(data, code):
    dec = FrameDecoder()
    assert_fatal(dec.feed(data), code)
    assert dec.closed


def test_bin_map_keys_anywhere_are_malformed_and_close_the_connection():
    """docs/protocol.md: map keys are str; a bin key (``{b"op": "ping"}``) is not "op".
    Before, strict_map_key let bin keys through and the request got ``missing_field``
    with the connection kept."""
    for msg in ({b"op": "ping", "rid": 1},
                {"op": "signal", "rid": 2, "context": "ls", "decision": "allow",
                 "extra": {b"k": 1}},
                {"op": "signals", "rid": 3, "signals": [{b"context": "ls", "decision": "allow"}]}):
        dec = FrameDecoder()
        items = dec.feed(pack({"op": "ping", "rid": 0}) + pack(msg) + pack({"op": "ping"}))
        assert isinstance(items[0], Request) and items[0].rid == 0  # earlier ones answered
        assert len(items) == 2, items
        assert_fatal(items, "malformed")
        assert "map key" in items[-1].message and "bin" in items[-1].message
        assert dec.closed
    # the unpacker the decoder builds without an item budget refuses them too
    unpacker = make_unpacker()
    unpacker.feed(pack({b"op": "ping"}))
    with pytest.raises(ValueError, match="map key"):
        unpacker.unpack()


def test_huge_headers_do_not_allocate():
    tracemalloc.start()
    try:
        for header in (b"\xdd\x7f\xff\xff\xff", b"\xdf\x7f\xff\xff\xff",
                       b"\xdd\xff\xff\xff\xff"):
            dec = FrameDecoder()
            assert len(dec.feed(pack({"op": "ping"}))) == 1  # allocates the read buffer
            tracemalloc.reset_peak()
            before, _ = tracemalloc.get_traced_memory()
            assert_fatal(dec.feed(header), "too_large")
            _, peak = tracemalloc.get_traced_memory()
            # a list of 2^31 slots would be 16 GiB
            assert peak - before < 1 << 16, f"{header!r} made the decoder allocate " \
                                            f"{peak - before} bytes"
    finally:
        tracemalloc.stop()


def test_huge_str_header_is_bounded_by_the_message_size():
    lim = Limits(max_message_bytes=64 * 1024)
    dec = FrameDecoder(lim)
    assert dec.feed(b"\xdb\x7f\xff\xff\xff") == []  # waits for the body...
    chunk = b"a" * 4096
    items: list = []
    for _ in range(20):
        items = dec.feed(chunk)
        if items:
            break
    assert_fatal(items, "too_large")
    assert dec.pending_bytes <= lim.max_message_bytes


def test_oversize_frame_default_limits():
    dec = FrameDecoder()
    blob = pack({"op": "predict", "context": "x" * (9 * 1024 * 1024)})
    items: list = []
    for i in range(0, len(blob), 1 << 16):
        items += dec.feed(blob[i:i + (1 << 16)])
        if dec.closed:
            break
    assert_fatal(items, "too_large")


def test_message_made_of_many_small_strings_is_bounded_too():
    # msgpack consumes the bytes of a partly decoded container, so its buffer alone does
    # not bound a message; the decoder counts the bytes since the last message boundary.
    lim = Limits(max_message_bytes=4096)
    dec = FrameDecoder(lim)
    big = pack({"op": "signals", "signals": [{"context": "y" * 100}] * 200})
    items: list = []
    for i in range(0, len(big), 512):
        items += dec.feed(big[i:i + 512])
    assert_fatal(items, "too_large")


def test_exactly_max_size_message_is_accepted():
    lim = Limits(max_message_bytes=70000, max_context_bytes=70000)
    n = lim.max_message_bytes - len(pack({"op": "predict", "context": "z" * 65536})) + 65536
    msg = pack({"op": "predict", "context": "z" * n})
    assert len(msg) == lim.max_message_bytes
    dec = FrameDecoder(lim)
    (req,) = dec.feed(msg + pack({"op": "ping"})[:1])
    assert isinstance(req, Request) and dec.pending_bytes == 1


def test_object_budget_bounds_amplification():
    lim = Limits(max_items=1000)
    dec = FrameDecoder(lim)
    # 600 empty maps: 600 bytes on the wire, 600 dicts in memory
    assert_fatal(dec.feed(pack({"op": "signals", "signals": [{}] * 600})), "too_large")
    # the budget is per message: two messages of 400 objects each are fine
    dec = FrameDecoder(lim)
    msg = pack({"op": "signals", "signals": [{}] * 400})
    items = dec.feed(msg + msg)
    assert [type(i) for i in items] == [Request, Request]
    # ...also when a message arrives in pieces
    dec = FrameDecoder(lim)
    got = []
    for i in range(0, len(msg) * 3, 7):
        got += dec.feed((msg * 3)[i:i + 7])
    assert [type(i) for i in got] == [Request] * 3


def test_random_bytes_never_raise():
    rng = random.Random(1234)
    fatal = 0
    for trial in range(300):
        dec = FrameDecoder(Limits(max_message_bytes=16 * 1024))
        blob = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 2048)))
        if trial % 3 == 0:  # some valid traffic first
            blob = pack({"op": "ping", "rid": trial}) + blob
        items = []
        for i in range(0, len(blob), rng.randint(1, 300)):
            items += dec.feed(blob[i:i + 300])
        for k, it in enumerate(items):
            assert isinstance(it, (Request, ProtocolError))
            if isinstance(it, ProtocolError):
                assert it.code in ERROR_CODES
                if it.fatal:
                    assert k == len(items) - 1
                    fatal += 1
        if trial % 3 == 0:
            assert isinstance(items[0], Request) and items[0].rid == trial
    assert fatal > 100  # most random blobs are garbage and close the connection


# --- unpacker, replies, limits ---------------------------------------------------------

def test_make_unpacker_has_explicit_limits():
    u = make_unpacker(Limits(max_map_len=2))
    u.feed(pack({"a": 1, "b": 2, "c": 3}))
    with pytest.raises(ValueError, match="max_map_len"):
        u.unpack()


def test_replies():
    assert ok_reply(3, seq=9, duplicate=False) == {"rid": 3, "ok": True, "seq": 9,
                                                   "duplicate": False}
    assert error_reply("r", "unknown_op", "no") == {
        "rid": "r", "ok": False, "error": {"code": "unknown_op", "message": "no"}}
    # never raises while reporting an error, even for a code outside the vocabulary
    assert error_reply(1, "oops", "x")["error"] == {"code": "oops", "message": "x"}
    with pytest.raises(ValueError):
        ProtocolError("oops", "not a code")


def test_pack_numpy_scalars_and_arrays():
    out = msgpack.unpackb(pack(ok_reply(1, p_allow=np.float32(0.25), v=np.int64(3),
                                        a=np.arange(3))), raw=False)
    assert out == {"rid": 1, "ok": True, "p_allow": 0.25, "v": 3, "a": [0, 1, 2]}
    with pytest.raises(TypeError):
        pack({"x": object()})


def test_limits_validation():
    with pytest.raises(ValueError, match="max_batch"):
        Limits(max_batch=0)
    with pytest.raises(ValueError, match="max_array_len"):
        Limits(max_batch=5000, max_array_len=4096)
    with pytest.raises(ValueError, match="positive integer"):
        Limits(max_depth=2.5)


def test_validate_request_directly():
    r = validate_request({"op": "predict", "rid": 1, "context": "c", "unknown": 1})
    assert r.op == "predict" and r.history == []
    with pytest.raises(ProtocolError) as ei:
        validate_request("ping")
    assert ei.value.code == "not_a_map" and not ei.value.fatal


# --- the example client of docs/protocol.md -------------------------------------------

def _fake_daemon(listener, seen: list) -> None:
    """A minimal server on FrameDecoder: what the real daemon's read loop does."""
    conn, _ = listener.accept()
    dec = FrameDecoder()
    with conn:
        while True:
            data = conn.recv(65536)
            if not data:
                return
            for item in dec.feed(data):
                if isinstance(item, ProtocolError):
                    conn.sendall(pack(item.reply()))
                    if item.fatal:
                        return
                    continue
                seen.append(item)
                if item.op == "signal":
                    reply = ok_reply(item.rid, seq=1, duplicate=False)
                else:
                    reply = ok_reply(item.rid, p_allow=np.float32(0.25), band="ask", version=3)
                conn.sendall(pack(reply))


def test_the_documented_example_client_runs(tmp_path):
    doc = (Path(__file__).resolve().parents[1] / "docs" / "protocol.md").read_text()
    code = doc.split("```python\n", 1)[1].split("```", 1)[0]
    assert 15 <= len([ln for ln in code.splitlines() if ln.strip()]) <= 30
    path = str(tmp_path / "gated.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    seen: list = []
    t = threading.Thread(target=_fake_daemon, args=(listener, seen), daemon=True)
    t.start()
    try:
        out = subprocess.run([sys.executable, "-c", code, path], capture_output=True,
                             text=True, timeout=60)
    finally:
        listener.close()
    assert out.returncode == 0, out.stderr
    t.join(timeout=10)
    assert [r.op for r in seen] == ["signal", "predict"]
    assert seen[0].signal["decision"] == "block" and seen[0].signal["id"] == "example-1"
    assert "'seq': 1" in out.stdout and "'band': 'ask'" in out.stdout


def test_every_error_code_is_in_the_protocol_doc():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "protocol.md").read_text()
    table = {line.split("|")[1].strip().strip("`") for line in doc.splitlines()
             if line.startswith("| `")}
    missing = [c for c in ERROR_CODES if c not in table]
    assert not missing, f"docs/protocol.md's error table does not list {missing}"
