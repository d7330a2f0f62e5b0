"""The replay reservoir's supersession by (context, history) fingerprint, against real LMDB
in a temp dir: a correction replaces the mistaken example, newer decisions relabel and
unlock, the index stays right through evictions."""

from __future__ import annotations

import random

from gated.signals import context_fingerprint
from gated.store import Store


def _ex(context: str, label: float, seq: int, feedback: str | None = None,
        history: list[str] | None = None) -> dict:
    return {"context": context, "history": history or [], "reason": None, "label": label,
            "weight": 1.0, "feedback": feedback, "seq": seq,
            "fp": context_fingerprint(context, history)}


def _held(store: Store) -> dict[tuple[str, tuple], tuple[float, bool]]:
    out = {}
    for e in store.reservoir_sample(1000, random.Random(0)):
        key = (e["context"], tuple(e["history"]))
        assert key not in out, f"{key} is stored twice"
        out[key] = (e["label"], e["locked"])
    return out


def test_a_correction_supersedes_the_mistaken_example(tmp_path):
    store = Store(tmp_path / "s")
    rng = random.Random(0)
    store.reservoir_add([_ex("db.query DROP TABLE x", 1.0, 1, history=["fs.read a"]),
                         _ex("fs.read b", 1.0, 2)], rng)
    # the gate allowed it (label 1); a person reports a false negative: label 0, locked
    store.reservoir_add([_ex("db.query DROP TABLE x", 0.0, 3, "false_negative",
                             history=["fs.read a"])], rng)
    held = _held(store)
    assert held[("db.query DROP TABLE x", ("fs.read a",))] == (0.0, True)
    assert store.reservoir_stats()["size"] == 2 and store.reservoir_stats()["locked"] == 1
    # the same context in ANOTHER session (other history) is another call: not touched
    store.reservoir_add([_ex("db.query DROP TABLE x", 1.0, 4, history=["ls"])], rng)
    assert _held(store)[("db.query DROP TABLE x", ("fs.read a",))] == (0.0, True)
    store.close()


def test_newer_decisions_relabel_and_unlock(tmp_path):
    store = Store(tmp_path / "s")
    rng = random.Random(0)
    store.reservoir_add([_ex("http.request GET x", 1.0, 1),
                         _ex("pkg.install foo", 1.0, 2, "false_positive")], rng)
    # policy v2: the same calls are now blocked by the gate
    store.reservoir_add([_ex("http.request GET x", 0.0, 3), _ex("pkg.install foo", 0.0, 4)],
                        rng)
    held = _held(store)
    assert held[("http.request GET x", ())] == (0.0, False)  # relabelled in place
    assert held[("pkg.install foo", ())] == (0.0, False)  # contradicted lock: unlocked
    # a decision that AGREES with a correction leaves it locked
    store.reservoir_add([_ex("git.push main", 0.0, 5, "false_negative")], rng)
    store.reservoir_add([_ex("git.push main", 0.0, 6)], rng)
    assert _held(store)[("git.push main", ())] == (0.0, True)
    assert store.reservoir_stats()["size"] == 3
    store.close()


def test_supersession_keeps_the_index_right_through_evictions(tmp_path):
    """Random replacement (Algorithm R) and evictions move slots; a later correction of
    any call still finds its one example."""
    store = Store(tmp_path / "s", replay_slots=20)
    rng = random.Random(3)
    store.reservoir_add([_ex(f"call {i}", 1.0, i + 1) for i in range(200)], rng)
    store.reservoir_add([_ex(f"fix {i}", 0.0, 300 + i, "false_negative") for i in range(5)],
                        rng)
    held = _held(store)
    assert len(held) == 20
    assert sum(locked for _, locked in held.values()) == 5  # evicted ordinary ones for room
    for n, ((ctx, _), (_, locked)) in enumerate(held.items()):
        if not locked:
            store.reservoir_add([_ex(ctx, 0.5, 1000 + n)], rng)
    after = _held(store)
    assert len(after) == 20
    assert sorted(k for k, (lab, _) in after.items() if lab == 0.5) == sorted(
        k for k, (_, lk) in held.items() if not lk)
    store.close()


def test_forget_before_drops_old_ordinary_examples_and_keeps_corrections(tmp_path):
    store = Store(tmp_path / "s")
    rng = random.Random(0)
    store.reservoir_add([_ex(f"old {i}", 1.0, i + 1) for i in range(30)], rng)
    store.reservoir_add([_ex("old fix", 0.0, 31, "false_negative")], rng)
    store.reservoir_add([_ex(f"new {i}", 0.0, 100 + i) for i in range(10)], rng)
    assert store.reservoir_forget_before(100) == 30
    held = _held(store)
    assert set(held) == {("old fix", ())} | {(f"new {i}", ()) for i in range(10)}
    # the index still works after the rewrite
    store.reservoir_add([_ex("new 3", 1.0, 200)], rng)
    assert _held(store)[("new 3", ())] == (1.0, False) and store.reservoir_size() == 11
    store.close()
