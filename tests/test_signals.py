"""Signal validation, the label/weight table and context fingerprints (DESIGN.md section 2)."""

from __future__ import annotations

import pytest

from gated.config import Limits
from gated.signals import (
    SignalError,
    WeightTable,
    context_fingerprint,
    escalation_key,
    label_and_weight,
    training_example,
    validate_signal,
)


def sig(**kw):
    base = {"context": "shell.exec(cmd='ls -la')", "decision": "allow"}
    base.update(kw)
    return base


def code_of(obj, **kw) -> str:
    with pytest.raises(SignalError) as info:
        validate_signal(obj, **kw)
    assert info.value.message, "every error must tell the client what to fix"
    assert info.value.to_dict() == {"code": info.value.code, "message": info.value.message}
    return info.value.code


def test_minimal_signal_is_normalised():
    out = validate_signal(sig())
    assert out == {"context": "shell.exec(cmd='ls -la')", "history": [], "decision": "allow",
                   "feedback": None, "reason": None, "id": None, "ts": None,
                   "prediction_id": None}
    assert validate_signal(out) == out  # idempotent: layers may validate again


def test_full_signal_keeps_every_field():
    out = validate_signal(sig(id="abc", history=("a", "b"), feedback="false_positive",
                              reason="matches deny rule 7", ts=1700000000))
    assert out["history"] == ["a", "b"]
    assert out["ts"] == 1700000000.0 and isinstance(out["ts"], float)
    assert out["feedback"] == "false_positive" and out["id"] == "abc"
    assert out["reason"] == "matches deny rule 7"


@pytest.mark.parametrize("obj, code", [
    ([1, 2], "wrong_type"),
    ({"decision": "allow"}, "missing_field"),
    (sig(context=None), "missing_field"),
    (sig(context=b"bytes"), "wrong_type"),
    (sig(context="   "), "invalid_value"),
    ({"context": "x"}, "missing_field"),
    (sig(decision="maybe"), "invalid_value"),
    (sig(decision=1), "wrong_type"),
    (sig(feedback="sure"), "invalid_value"),
    (sig(feedback=True), "wrong_type"),
    (sig(history="not a list"), "wrong_type"),
    (sig(history=["ok", 3]), "wrong_type"),
    (sig(id=""), "invalid_value"),
    (sig(id=42), "wrong_type"),
    (sig(ts="yesterday"), "wrong_type"),
    (sig(ts=True), "wrong_type"),
    (sig(ts=float("nan")), "invalid_value"),
    (sig(reason=["x"]), "wrong_type"),
    (sig(feedbak="confirm"), "unknown_field"),
    (sig(context="bad \udc80 surrogate"), "invalid_value"),
])
def test_invalid_signals_get_a_code(obj, code):
    assert code_of(obj) == code


def test_unknown_key_message_names_the_key_and_allowed_keys():
    with pytest.raises(SignalError) as info:
        validate_signal(sig(feedbak="confirm"))
    assert "feedbak" in info.value.message and "feedback" in info.value.message


def test_transport_keys_are_unknown_to_the_signal_validator():
    # gated/protocol.py strips op and rid from a `signal` request before validation
    assert code_of(sig(op="signal")) == "unknown_field"
    assert code_of(sig(rid=7)) == "unknown_field"


LIM = Limits()
MAX_CONTEXT_BYTES, MAX_HISTORY_ITEMS = LIM.max_context_bytes, LIM.max_history
MAX_ID_BYTES, MAX_REASON_BYTES = LIM.max_id_bytes, LIM.max_reason_bytes


def test_default_limits_are_design_section_2():
    assert (MAX_CONTEXT_BYTES, MAX_HISTORY_ITEMS, MAX_ID_BYTES, MAX_REASON_BYTES) == (
        64 * 1024, 16, 128, 4 * 1024)


def test_size_limits_are_bytes_and_inclusive():
    validate_signal(sig(context="x" * MAX_CONTEXT_BYTES))
    assert code_of(sig(context="x" * (MAX_CONTEXT_BYTES + 1))) == "too_large"
    # 2-byte characters: the limit counts UTF-8 bytes, not characters
    validate_signal(sig(id="é" * (MAX_ID_BYTES // 2)))
    assert code_of(sig(id="é" * (MAX_ID_BYTES // 2 + 1))) == "too_large"
    validate_signal(sig(reason="r" * MAX_REASON_BYTES))
    assert code_of(sig(reason="r" * (MAX_REASON_BYTES + 1))) == "too_large"
    validate_signal(sig(history=["h"] * MAX_HISTORY_ITEMS))
    assert code_of(sig(history=["h"] * (MAX_HISTORY_ITEMS + 1))) == "too_large"


def test_configured_limits_apply_to_every_field():
    lim = Limits(max_context_bytes=64, max_history=2, max_reason_bytes=16, max_id_bytes=16)
    ok = sig(context="c" * 64, history=["h" * 64] * 2, reason="r" * 16, id="i" * 16)
    assert validate_signal(ok, lim)["id"] == "i" * 16
    validate_signal(ok)  # well within the defaults
    for over, what in ((dict(context="c" * 65), "'context' is 65 bytes; the limit is 64"),
                       (dict(history=["h"] * 3), "'history' has 3 items; the limit is 2"),
                       (dict(history=["h", "h" * 65]), "'history[1]' is 65 bytes"),
                       (dict(reason="r" * 17), "'reason' is 17 bytes; the limit is 16"),
                       (dict(id="i" * 17), "'id' is 17 bytes; the limit is 16")):
        with pytest.raises(SignalError) as info:
            validate_signal({**ok, **over}, lim)
        assert info.value.code == "too_large" and what in info.value.message, over
        validate_signal({**ok, **over})  # the same signal passes the default limits


def test_too_large_message_says_the_limit():
    with pytest.raises(SignalError) as info:
        validate_signal(sig(context="x" * (MAX_CONTEXT_BYTES + 5)))
    assert str(MAX_CONTEXT_BYTES) in info.value.message


def test_empty_reason_means_no_reason():
    assert validate_signal(sig(reason=""))["reason"] is None


@pytest.mark.parametrize("decision, feedback, label, weight", [
    ("allow", None, 1.0, 1.0),
    ("block", None, 0.0, 1.0),
    ("allow", "confirm", 1.0, 1.0),
    ("block", "confirm", 0.0, 1.0),
    ("block", "override_allow", 1.0, 2.0),
    ("allow", "override_block", 0.0, 2.0),
    ("block", "false_positive", 1.0, 4.0),
    ("allow", "false_negative", 0.0, 4.0),
])
def test_label_and_weight_table(decision, feedback, label, weight):
    s = validate_signal(sig(decision=decision, feedback=feedback))
    assert label_and_weight(s, 0, WeightTable()) == (label, weight)


def test_escalation_4_6_8_then_stays():
    s = validate_signal(sig(decision="block", feedback="false_positive"))
    weights = [label_and_weight(s, k, WeightTable())[1] for k in range(5)]
    assert weights == [4.0, 6.0, 8.0, 8.0, 8.0]
    # the count only matters for false positives / negatives
    plain = validate_signal(sig())
    assert label_and_weight(plain, 5, WeightTable()) == (1.0, 1.0)


def test_weight_table_is_configurable_and_validated():
    table = WeightTable(confirm=0.5, override=3, escalation=(5, 10))
    fp = validate_signal(sig(decision="block", feedback="false_positive"))
    assert label_and_weight(validate_signal(sig()), 0, table) == (1.0, 0.5)
    assert [label_and_weight(fp, k, table)[1] for k in range(3)] == [5.0, 10.0, 10.0]
    with pytest.raises(ValueError):
        WeightTable(confirm=0)
    with pytest.raises(ValueError):
        WeightTable(escalation=())


def test_fingerprint_normalises_whitespace_only():
    a = context_fingerprint("shell.exec( cmd='ls' )")
    assert len(a) == 16
    assert context_fingerprint("  shell.exec(\tcmd='ls'\n)  ") == a
    assert context_fingerprint("shell.exec(  cmd='ls'  )") == a
    assert context_fingerprint("shell.exec( cmd='LS' )") != a  # case matters
    assert context_fingerprint("shell.exec( cmd='ls' )", ["prev"]) != a
    # length prefixes: moving text between parts changes the fingerprint
    assert context_fingerprint("ab", ["c"]) != context_fingerprint("a", ["bc"])


def test_escalation_key_separates_kinds_and_ignores_history_by_default():
    fp = validate_signal(sig(decision="block", feedback="false_positive", history=["x"]))
    fn = validate_signal(sig(decision="allow", feedback="false_negative"))
    assert escalation_key(fp)[:1] == b"P" and escalation_key(fn)[:1] == b"N"
    assert escalation_key(fp)[1:] == escalation_key(fn)[1:]  # same context, history ignored
    with_hist = WeightTable(fingerprint_history=True)
    assert escalation_key(fp, with_hist) != escalation_key(fp)
    assert escalation_key(validate_signal(sig(feedback="confirm"))) is None


def test_training_example_from_stored_signal():
    stored = {**validate_signal(sig(history=["a"], reason="ok", feedback="false_negative")),
              "label": 0.0, "weight": 6.0}
    ex = training_example(stored)
    assert ex == {"context": stored["context"], "history": ["a"], "reason": "ok",
                  "label": 0.0, "weight": 6.0, "feedback": "false_negative"}


def test_history_items_are_checked_by_utf8_bytes_type_and_text():
    """The history's ASCII fast path and its item-by-item path give the same verdicts:
    the limit counts UTF-8 bytes (a 2-byte character counts twice), a non-string item
    and a lone surrogate are named by their index, and a tuple or a str subclass passes
    as a list of plain strings."""
    lim = Limits(max_context_bytes=8)
    assert validate_signal(sig(context="ls", history=["abcdefgh", "é" * 4]), lim)["history"] == [
        "abcdefgh", "é" * 4]
    for history, code, what in ((["ok", "é" * 5], "too_large", "'history[1]' is 10 bytes"),
                                (["ok", "x" * 9], "too_large", "'history[1]' is 9 bytes"),
                                (["ok", 7], "wrong_type", "'history[1]' must be a string"),
                                ([b"ok"], "wrong_type", "'history[0]' must be a string"),
                                (["ok", "a\udc80"], "invalid_value", "'history[1]' is not "
                                                                     "valid UTF-8")):
        with pytest.raises(SignalError) as info:
            validate_signal(sig(context="ls", history=history), lim)
        assert info.value.code == code and what in info.value.message, history

    class Text(str):
        pass

    out = validate_signal(sig(context="ls", history=("a", Text("b"))), lim)["history"]
    assert out == ["a", "b"] and type(out) is list
