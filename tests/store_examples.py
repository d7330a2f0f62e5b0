"""Signals, replay examples and a checkpoint layout shared by the store's tests."""

from __future__ import annotations

from gated.signals import validate_signal

#: a small parameter layout (45 floats) for checkpoints that need no model
LAYOUT = [("tok_emb", (10, 4)), ("gate.w", (1, 4)), ("gate.b", (1,))]
N = 45


def sig(i: int | str, **kw) -> dict:
    """A raw signal as a client sends it, with a unique id per `i`."""
    base = {"context": f"fs.read(path='/srv/{i}')", "decision": "allow", "id": f"id-{i}"}
    base.update(kw)
    return base


def vsig(i: int | str, **kw) -> dict:
    """A signal as the daemon hands it to the group committer: validated once, at ingest."""
    return validate_signal(sig(i, **kw))


def ex(i: int, feedback: str | None = None) -> dict:
    """A replay example as the trainer offers it to the reservoir."""
    return {"context": f"call {i}", "history": [], "reason": None, "label": 1.0,
            "weight": 1.0, "feedback": feedback, "i": i}
