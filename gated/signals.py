"""Gate-decision signals: validation, the label/weight table, context fingerprints.

A *signal* (DESIGN.md section 2) is what the gateway sends for every decision it made and
for every correction a person made afterwards. This module is pure (no I/O): it decides
whether a signal is acceptable, and what the model should learn from it. The store
(`gated.store`) applies these rules inside the write transaction that acknowledges the
signal, so the weight a trainer reads is the one decided at ingest, and the
false-positive/false-negative escalation survives restarts.

Unknown keys: rejected (code ``unknown_field``). A misspelt ``feedbak`` silently dropped
would lose a person's correction, which is worse than asking the client to fix its map.
(The transport keys ``op`` and ``rid`` never get here: gated/protocol.py strips them.)

Sizes are checked against the configured :class:`gated.config.Limits` (``[limits]``:
``max_context_bytes`` for the context and each history entry, ``max_history``,
``max_reason_bytes``, ``max_id_bytes``), the same numbers the protocol checks a
``predict`` request against. The daemon validates each signal once, at ingest; the store
trusts what comes out of :func:`validate_signal`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .config import Limits

#: The size limits a signal is checked against when the caller passes none: the
#: defaults of ``[limits]`` (DESIGN.md section 2; sizes are UTF-8 bytes).
DEFAULT_LIMITS = Limits()

DECISIONS = ("allow", "block")
FEEDBACKS = ("confirm", "override_allow", "override_block", "false_positive", "false_negative")
#: Feedback kinds that correct the gate (a person's word on the call, not a confirmation).
CORRECTIONS = ("override_allow", "override_block", "false_positive", "false_negative")
#: Feedback kinds whose examples escalate in weight and are locked in the replay reservoir.
ESCALATING = ("false_positive", "false_negative")

SIGNAL_KEYS = ("id", "context", "history", "decision", "feedback", "reason", "ts",
               "prediction_id")
#: The same keys as a set: what `validate_signal` accepts and returns, and what the group
#: committer checks a normalised signal against.
SIGNAL_KEY_SET = frozenset(SIGNAL_KEYS)


class SignalError(ValueError):
    """A signal the daemon refuses; ``code`` is stable, ``message`` tells the client what to fix."""

    def __init__(self, code: str, message: str, *, index: int | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.index = index  # position in a batch, when known

    def to_dict(self) -> dict[str, str]:
        """The wire form of DESIGN.md section 5: ``{"code", "message"}``."""
        return {"code": self.code, "message": self.message}


def _utf8_len(value: str, key: str) -> int:
    if value.isascii():  # O(1) in CPython (a flag of the string), and most text is ASCII
        return len(value)
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise SignalError("invalid_value", f"'{key}' is not valid UTF-8 text ({e.reason}); "
                                       "send it as a UTF-8 string") from None


def _string(obj: Mapping[str, Any], key: str, limit: int, *, required: bool) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise SignalError("missing_field", f"'{key}' is required (a string)")
        return None
    if not isinstance(value, str):
        raise SignalError("wrong_type", f"'{key}' must be a string, got {type(value).__name__}")
    size = len(value) if value.isascii() else _utf8_len(value, key)  # inline: per signal
    if size > limit:
        raise SignalError("too_large", f"'{key}' is {size} bytes; the limit is {limit} bytes "
                                       "(UTF-8); shorten it")
    return value


def _history_items(items: list | tuple, cap: int) -> list[str]:
    """The history's items checked one by one: the first bad one raises its own error."""
    history: list[str] = []
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise SignalError("wrong_type", f"'history[{i}]' must be a string, got "
                                            f"{type(item).__name__}")
        size = _utf8_len(item, f"history[{i}]")
        if size > cap:
            raise SignalError("too_large", f"'history[{i}]' is {size} bytes; the limit is "
                                           f"{cap} bytes (UTF-8)")
        history.append(item)
    return history


def validate_signal(obj: Any, limits: Limits | None = None) -> dict[str, Any]:
    """Check a signal map and return its normalised form, or raise `SignalError`.

    Sizes are checked against ``limits`` (the config's ``[limits]``; None means the
    defaults). The result always has the eight keys ``context, history, decision,
    feedback, reason, id, ts, prediction_id`` (absent optional values are None,
    ``history`` is a list, an empty ``reason`` is None, ``ts`` is a float). Validating an
    already normalised signal returns an equal dict. An unknown key is an error.

    ``prediction_id`` is the id a ``predict``/``explain`` reply carried, linking this
    outcome to that served prediction (the audit log, served alignment); at most
    ``max_prediction_id_bytes``.
    """
    lim = DEFAULT_LIMITS if limits is None else limits
    if not isinstance(obj, Mapping):
        raise SignalError("wrong_type", f"a signal must be a map, got {type(obj).__name__}")
    if not SIGNAL_KEY_SET.issuperset(obj):
        key = next(k for k in obj if k not in SIGNAL_KEY_SET)
        raise SignalError("unknown_field", f"unknown key {str(key)[:64]!r}; a signal has "
                                           f"only {', '.join(SIGNAL_KEYS)}")
    context = _string(obj, "context", lim.max_context_bytes, required=True)
    assert context is not None
    if not context.strip():
        raise SignalError("invalid_value", "'context' is empty; send the tool call as the gate "
                                       "saw it (tool name and arguments)")

    history_raw = obj.get("history")
    history: list[str] = []
    if history_raw is not None:
        if not isinstance(history_raw, list | tuple):
            raise SignalError("wrong_type", "'history' must be a list of strings, got "
                                            f"{type(history_raw).__name__}")
        if len(history_raw) > lim.max_history:
            raise SignalError("too_large", f"'history' has {len(history_raw)} items; the limit "
                                           f"is {lim.max_history}: send the most recent ones")
        cap = lim.max_context_bytes
        if all(type(item) is str and item.isascii() and len(item) <= cap
               for item in history_raw):  # the common case, checked in one pass
            history = list(history_raw)
        else:
            history = _history_items(history_raw, cap)

    decision = obj.get("decision")
    if decision is None:
        raise SignalError("missing_field", "'decision' is required: \"allow\" or \"block\"")
    if not isinstance(decision, str):
        raise SignalError("wrong_type", f"'decision' must be a string, got "
                                        f"{type(decision).__name__}")
    if decision not in DECISIONS:
        raise SignalError("invalid_value", f"'decision' is {decision[:32]!r}; it must be \"allow\" "
                                       "or \"block\"")

    feedback = obj.get("feedback")
    if feedback is not None:
        if not isinstance(feedback, str):
            raise SignalError("wrong_type", f"'feedback' must be a string, got "
                                            f"{type(feedback).__name__}")
        if feedback not in FEEDBACKS:
            raise SignalError("invalid_value", f"'feedback' is {feedback[:32]!r}; it must be "
                                               f"one of {', '.join(FEEDBACKS)} (or absent)")

    reason = _string(obj, "reason", lim.max_reason_bytes, required=False) or None

    sid = _string(obj, "id", lim.max_id_bytes, required=False)
    if sid == "":
        raise SignalError("invalid_value", "'id' is empty; leave it out or send a unique string")

    ts = obj.get("ts")
    if ts is not None:
        if isinstance(ts, bool) or not isinstance(ts, int | float):
            raise SignalError("wrong_type", f"'ts' must be a number (unix seconds), got "
                                            f"{type(ts).__name__}")
        ts = float(ts)
        if not math.isfinite(ts):
            raise SignalError("invalid_value", "'ts' must be a finite number of unix seconds")

    pid = _string(obj, "prediction_id", lim.max_prediction_id_bytes, required=False)
    if pid == "":
        raise SignalError("invalid_value", "'prediction_id' is empty; leave it out or send "
                                           "the id a predict reply carried")

    return {"context": context, "history": history, "decision": decision,
            "feedback": feedback, "reason": reason, "id": sid, "ts": ts,
            "prediction_id": pid}


def _norm_ws(text: str) -> str:
    return " ".join(text.split())


def context_fingerprint(context: str, history: Sequence[str] | None = None) -> bytes:
    """16-byte BLAKE2b of the whitespace-normalised context (and history, when given).

    Whitespace runs collapse to one space and the ends are stripped, so the same tool call
    formatted differently counts as the same call; case and everything else are kept
    (arguments are case-sensitive). Each part is length-prefixed so that no two different
    (context, history) pairs can hash the same input.
    """
    h = hashlib.blake2b(digest_size=16, person=b"gated-ctx-fp-v1")
    parts = [_norm_ws(context)]
    if history:
        parts += [_norm_ws(item) for item in history]
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.digest()


@dataclass(frozen=True)
class WeightTable:
    """DESIGN.md section 2's label/weight table, configurable.

    ``escalation[k]`` is the weight of the (k+1)-th false positive (or false negative) for
    the same context fingerprint; after the last entry the weight stays there.
    ``fingerprint_history`` keys escalation by context *and* session history; the default
    keys by context alone, so a repeated correction of the same tool call escalates even
    when it comes from a different session.
    """

    confirm: float = 1.0
    override: float = 2.0
    escalation: tuple[float, ...] = field(default=(4.0, 6.0, 8.0))
    fingerprint_history: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "escalation", tuple(float(w) for w in self.escalation))
        weights = (self.confirm, self.override, *self.escalation)
        if not self.escalation:
            raise ValueError("weights.escalation needs at least one weight, e.g. [4, 6, 8]")
        for w in weights:
            if not (isinstance(w, int | float) and math.isfinite(w) and w > 0):
                raise ValueError(f"signal weights must be finite and > 0, got {w!r}")

    def escalated(self, prior_count: int) -> float:
        """Weight of a correction seen ``prior_count`` times before for the same context."""
        return self.escalation[min(max(prior_count, 0), len(self.escalation) - 1)]


DEFAULT_WEIGHTS = WeightTable()


def label_and_weight(signal: Mapping[str, Any], prior_fp_count: int,
                     table: WeightTable = DEFAULT_WEIGHTS) -> tuple[float, float]:
    """(label y, weight w) of a normalised signal; y = 1.0 means allow.

    ``prior_fp_count`` is how many earlier corrections of the same kind (false positive or
    false negative) were stored for this signal's context fingerprint; it only matters for
    those two kinds. The feedback decides the label; ``decision`` only counts when there is
    no feedback or a confirmation.
    """
    feedback = signal.get("feedback")
    if feedback is None or feedback == "confirm":
        return (1.0 if signal["decision"] == "allow" else 0.0), table.confirm
    if feedback == "override_allow":
        return 1.0, table.override
    if feedback == "override_block":
        return 0.0, table.override
    if feedback == "false_positive":
        return 1.0, table.escalated(prior_fp_count)
    if feedback == "false_negative":
        return 0.0, table.escalated(prior_fp_count)
    raise SignalError("invalid_value", f"unknown feedback {feedback!r}")


def escalation_key(signal: Mapping[str, Any], table: WeightTable = DEFAULT_WEIGHTS) -> bytes | None:
    """Store key of the escalation counter this signal bumps, or None if it bumps none.

    False positives and false negatives are counted separately: b"P" or b"N" + fingerprint.
    """
    feedback = signal.get("feedback")
    if feedback not in ESCALATING:
        return None
    history = signal.get("history") if table.fingerprint_history else None
    prefix = b"P" if feedback == "false_positive" else b"N"
    return prefix + context_fingerprint(signal["context"], history)


def training_example(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored signal (with ``label`` and ``weight`` decided at ingest) as a training example.

    Keys: context, history, reason, label, weight, and feedback (kept so the replay
    reservoir can lock false-positive/negative examples).
    """
    return {"context": stored["context"], "history": list(stored.get("history") or []),
            "reason": stored.get("reason"), "label": float(stored["label"]),
            "weight": float(stored["weight"]), "feedback": stored.get("feedback")}
