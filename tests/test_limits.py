"""The `[limits]` of a config FILE apply to `signal`, `signals` and `predict` alike.

A real `gated run` process reads a config with small limits; the test talks to it over
its real Unix socket. For each size limit, a field exactly at the limit is accepted and
one byte (or one entry) over is refused with `too_large`, a message naming the field,
and the connection kept open (a soft limit).
"""

from __future__ import annotations

import pytest
from daemon_proc import start

from gated.client import GatedError

CONTEXT, HISTORY, REASON, ID = 64, 2, 16, 16

CONFIG = f"""
[limits]
max_context_bytes = {CONTEXT}
max_history = {HISTORY}
max_reason_bytes = {REASON}
max_id_bytes = {ID}
"""


def sig(tag: str, **over) -> dict:
    """A signal with every sized field exactly at its limit (sizes are UTF-8 bytes: the
    id is partly 2-byte characters), then ``over`` applied. ``tag`` (<= 8 characters)
    makes the id unique."""
    ident = f"{tag}-"
    ident += "é" * ((ID - len(ident)) // 2)
    ident += "x" * (ID - len(ident.encode()))
    assert len(ident.encode()) == ID, tag
    head = f"fs.read {tag} "
    s = {"context": head + "c" * (CONTEXT - len(head)),
         "history": ["h" * CONTEXT] * HISTORY,
         "reason": "r" * REASON,
         "id": ident,
         "decision": "allow"}
    s.update(over)
    return s


#: One field over its limit each, and the words the error message must contain.
OVER = {
    "ctx": ({"context": "c" * (CONTEXT + 1)}, f"'context' is {CONTEXT + 1} bytes"),
    "hlen": ({"history": ["h"] * (HISTORY + 1)}, f"'history' has {HISTORY + 1} items"),
    "hitem": ({"history": ["h", "h" * (CONTEXT + 1)]}, "'history[1]'"),
    "rsn": ({"reason": "r" * (REASON + 1)}, f"'reason' is {REASON + 1} bytes"),
    "id": ({"id": "i" * (ID - 1) + "é"}, f"'id' is {ID + 1} bytes"),
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limits")
    cfg = tmp / "gated.toml"
    cfg.write_text(CONFIG)
    d = start(tmp, config=cfg)
    try:
        yield d
    finally:
        assert d.stop() == 0, d.log()


def test_the_daemon_runs_on_the_configured_limits(daemon):
    """Guards the test itself: the daemon really runs on the small limits."""
    with daemon.client() as c:
        with pytest.raises(GatedError) as info:
            c.predict("x" * (CONTEXT + 1))
    assert info.value.code == "too_large" and str(CONTEXT) in info.value.message


def test_signal_accepts_at_the_limit_and_refuses_over_it(daemon):
    with daemon.client() as c:
        ok = c.signal(sig("s"))
        assert ok["seq"] >= 1 and ok["duplicate"] is False
        for name, (over, words) in OVER.items():
            with pytest.raises(GatedError) as info:
                c.signal(sig(f"s-{name}", **over))
            assert info.value.code == "too_large", name
            assert words in info.value.message, (name, info.value.message)
        # soft limits: the same connection still works, and nothing refused was stored
        again = c.signal(sig("s"))
        assert (again["seq"], again["duplicate"]) == (ok["seq"], True)
        for name in OVER:
            assert c.signal(sig(f"s-{name}"))["duplicate"] is False, name


def test_signals_batch_stores_the_good_entry_and_rejects_each_oversize_one(daemon):
    names = list(OVER)
    batch = [sig("b")] + [sig(f"b-{n}", **OVER[n][0]) for n in names]
    with daemon.client() as c:
        results = c.signals(batch)
        assert len(results) == 1 + len(names)
        good = results[0]
        assert "error" not in good and good["duplicate"] is False and good["seq"] >= 1
        for name, res in zip(names, results[1:], strict=True):
            assert set(res) == {"error"}, (name, res)
            assert res["error"]["code"] == "too_large", (name, res)
            assert OVER[name][1] in res["error"]["message"], (name, res)
        # the good one was stored (a re-send is a duplicate of it); the bad ones were not
        again = c.signals([sig("b")] + [sig(f"b-{n}") for n in names])
        assert (again[0]["seq"], again[0]["duplicate"]) == (good["seq"], True)
        assert [r["duplicate"] for r in again[1:]] == [False] * len(names)


def test_predict_accepts_at_the_limit_and_refuses_over_it(daemon):
    history = ["h" * CONTEXT] * HISTORY
    with daemon.client() as c:
        out = c.predict("c" * CONTEXT, history)
        assert 0.0 <= out["p_allow"] <= 1.0
        for context, hist, words in (
                ("c" * (CONTEXT + 1), None, f"'context' is longer than {CONTEXT}"),
                ("é" * (CONTEXT // 2) + "c", None, f"'context' is longer than {CONTEXT}"),
                ("c", ["h"] * (HISTORY + 1), f"'history' has {HISTORY + 1} entries"),
                ("c", ["h", "h" * (CONTEXT + 1)], f"history[1] is longer than {CONTEXT}")):
            with pytest.raises(GatedError) as info:
                c.predict(context, hist)
            assert info.value.code == "too_large", (context[:8], hist)
            assert words in info.value.message, info.value.message
        assert 0.0 <= c.predict("é" * (CONTEXT // 2))["p_allow"] <= 1.0
