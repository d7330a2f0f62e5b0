"""The promotion gate (daemon/trainer/promotion.py) on a real trainer and a real LMDB
store: a worse candidate is never published, held-back signals are never trained on, and
refusals in a row send training back to the serving weights."""

from __future__ import annotations

import dataclasses

import numpy as np

from gated.config import TrainConfig
from gated.daemon.trainer import TrainerEvents, build_trainer
from gated.engine import ModelConfig
from gated.signals import context_fingerprint
from gated.store import Store


class Recorder(TrainerEvents):
    def __init__(self) -> None:
        self.decisions: list[dict] = []

    def on_promotion(self, decision: dict) -> None:
        self.decisions.append(decision)


def _signals(n: int, start: int = 0) -> list[dict]:
    """Separable traffic: shell.exec with rm is blocked, fs.read allowed."""
    out = []
    for i in range(start, start + n):
        if i % 2:
            out.append({"context": f"shell.exec {{\"cmd\": \"rm -rf /srv/{i}\"}}",
                        "decision": "block"})
        else:
            out.append({"context": f"fs.read {{\"path\": \"src/m{i}.py\"}}",
                        "decision": "allow"})
    return out


def _trained(tmp_path, **kw):
    kw.setdefault("promotion_holdout_after", 0)  # hold back from the first signal
    store = Store(tmp_path / "state")
    settings = dataclasses.replace(
        TrainConfig(), lr=3e-3, swap_every_steps=1, swap_every_seconds=0.0,
        promotion_holdout_share=0.3, promotion_holdout_size=100, promotion_min_holdout=20,
        promotion_margin=0.01, **kw)
    events = Recorder()
    trainer, serving = build_trainer(store, ModelConfig.tiny(), settings, seed=0,
                                     events=events)
    store.append_signals(_signals(400))
    while trainer.status.last_trained_seq < 400:
        trainer.train_on(store.read_signals(trainer.status.last_trained_seq, 32))
    return store, trainer, serving, events


def _plant_bad_candidate(trainer) -> None:
    """Flip the gate: negate the gate head and the wide path, so every decision turns."""
    for name in ("gate.w", "gate.b", "wide.w"):
        trainer.model.params[name][...] *= -1.0
    trainer._steps_since_swap += 1
    trainer._deep_version += 1


def test_a_worse_candidate_is_not_published(tmp_path):
    store, trainer, serving, events = _trained(tmp_path)
    assert len(trainer.promotion.ring) >= 20
    assert events.decisions and events.decisions[-1]["published"]
    served = serving.current.logits
    version, flat = store.load_published()
    assert version == trainer.status.version == serving.current.version
    # the gate's own reading of the serving accuracy, without the trainer's turns: a
    # judgement called outside `_promoted` would let a turn publish (a version more, by
    # timing: it turned CI red once)
    between, trainer.promotion.between = trainer.promotion.between, None
    serve_acc = trainer.promotion.judge(trainer.model, trainer._deep_version,
                                        serving).serving
    trainer.promotion.between = between
    assert store.load_published()[0] == version, "the reading itself published nothing"
    assert serve_acc >= 0.8, "the tiny model should have learned this separable stream"

    _plant_bad_candidate(trainer)
    assert trainer._maybe_swap(force=True) is False
    d = events.decisions[-1]
    assert not d["published"] and d["candidate"] < d["serving"] - 0.01
    assert trainer.promotion.last.published is False
    # nothing moved: the store, the trainer's version and the serving snapshot
    v2, flat2 = store.load_published()
    assert v2 == version and trainer.status.version == version
    np.testing.assert_array_equal(flat2, flat)
    assert serving.current.logits == served
    store.close()


def test_an_equal_candidate_is_published(tmp_path):
    store, trainer, serving, events = _trained(tmp_path)
    version = trainer.status.version
    trainer._steps_since_swap += 1  # same weights: not worse
    assert trainer._maybe_swap(force=True) is True
    # (a turn inside the judgement may first publish the wide path's progress: a version
    # more, by timing; what must hold is that the judged candidate itself now serves)
    v, flat = store.load_published()
    assert v == trainer.status.version > version and events.decisions[-1]["published"]
    np.testing.assert_array_equal(flat, trainer.model.ops.to_numpy(trainer.model.flat))
    store.close()


def test_held_back_signals_are_scored_but_never_trained_on(tmp_path):
    store, trainer, serving, _ = _trained(tmp_path)
    held = {bytes(ex["fp"]) for ex in trainer.promotion.ring}
    assert held and trainer.window.total_scored == 400  # every signal scored
    replayed = store.reservoir_sample(10_000, np.random.default_rng(0))
    in_replay = {context_fingerprint(e["context"], e.get("history")) for e in replayed}
    assert replayed and not (held & in_replay)
    store.close()


def test_the_warm_up_holds_nothing_back_at_the_start_and_after_a_drift(tmp_path):
    """`promotion_holdout_after`: the first signals of a state, and the first after a
    detected drift, are all trained on; after them the gate holds back its share."""
    store, trainer, _, _ = _trained(tmp_path, promotion_holdout_after=250)
    held = list(trainer.promotion.ring)
    assert held, "after the warm-up the gate holds back its share"
    assert min(ex["seq"] for ex in held) > 250
    replayed = {e["seq"] for e in store.reservoir_sample(10_000, np.random.default_rng(0))}
    gate = trainer.promotion
    early = [q for q in range(1, 251) if gate.holds({"seq": 400 + q, "fp": _fp(q)})]
    assert early, "some of the first 250 would be held back without the warm-up"
    assert set(early) <= replayed, "the warm-up's signals are trained on (in the reservoir)"

    trainer._on_drift(380, 400)  # Page-Hinkley fired at signal 400
    assert not trainer.promotion.ring, "the old policy's slice is dropped"
    store.append_signals(_signals(400, start=400))
    while trainer.status.last_trained_seq < 800:
        trainer.train_on(store.read_signals(trainer.status.last_trained_seq, 32))
    assert trainer.promotion.ring and min(ex["seq"] for ex in trainer.promotion.ring) > 650
    store.close()


def test_during_the_warm_up_the_operator_is_told_why_nothing_is_judged(tmp_path):
    store, trainer, _, events = _trained(tmp_path, promotion_holdout_after=1000)
    assert not trainer.promotion.ring
    reason = events.decisions[-1]["reason"]
    assert "not judged" in reason and "up to signal 1000" in reason, reason
    store.close()


def _fp(seq: int) -> bytes:
    """The fingerprint of `_signals`'s signal number `seq` (1-based, as the store's)."""
    sig = _signals(1, start=seq - 1)[0]
    return context_fingerprint(sig["context"], sig.get("history"))


def test_refusals_in_a_row_send_training_back_to_the_serving_weights(tmp_path):
    store, trainer, serving, _ = _trained(tmp_path, promotion_max_refusals=2)
    _, published = store.load_published()
    _plant_bad_candidate(trainer)
    assert trainer._maybe_swap(force=True) is False
    assert not np.array_equal(trainer.model.ops.to_numpy(trainer.model.flat), published)
    trainer._steps_since_swap += 1
    assert trainer._maybe_swap(force=True) is False  # the second refusal: rolled back
    np.testing.assert_array_equal(trainer.model.ops.to_numpy(trainer.model.flat), published)
    assert trainer.status.rollbacks >= 1
    store.close()


def test_a_difference_within_noise_is_published_a_significant_one_is_not(tmp_path):
    """The gate is paired (McNemar): losing 3 held-back signals and winning 1 is 2 points
    worse on 100 -- beyond the 1-point margin, within noise -- and is published; losing
    20 and winning 2 is refused."""
    store, trainer, serving, _ = _trained(tmp_path)
    gate = trainer.promotion
    n = len(gate.ring)
    labels = np.array([ex["label"] >= 0.5 for ex in gate.ring])
    right = np.where(labels, 1.0, -1.0)  # logits that are right everywhere

    def judge(lost: int, won: int) -> bool:
        z_serve, z_cand = right.copy(), right.copy()
        z_serve[lost:lost + won] *= -1  # serving wrong where the candidate wins
        z_cand[:lost] *= -1  # candidate wrong where it loses
        gate._serving_logits = lambda serving, sources, seqs: z_serve
        gate._deep_logits = lambda model, step, sources, seqs: z_cand
        trainer.model.params["wide.w"][...] = 0.0
        return gate.judge(trainer.model, 0, serving).published

    assert n >= 60
    assert judge(3, 1) is True
    assert judge(20, 2) is False
    store.close()


def test_judging_takes_at_most_its_share_of_the_trainers_time(tmp_path):
    """A judgement costing J seconds defers the next publication by J / JUDGE_TIME_SHARE
    (flint's slice on a 2-core CPU costs seconds; judging at every swap starved training),
    and a published candidate's logits serve as the new version's: no second forward."""
    from gated.daemon.trainer import promotion

    store, trainer, serving, events = _trained(tmp_path)
    gate = trainer.promotion
    assert gate.judge_seconds > 0
    gate.judge_seconds = 3600.0  # as if the last judgement had taken an hour
    trainer._steps_since_swap += 1
    # A transformer step: every held-back row needs a fresh forward, so the judgement is an
    # expensive one (without it, whether the slice's logits were still cached depended on
    # how the time share had rationed _trained's last judgements: on CI they were, and the
    # cheap path published; this test failed there once).
    trainer._deep_version += 1
    assert gate._missing([ex["seq"] for ex in gate.ring], trainer._deep_version,
                         serving.current.version) > promotion.CHEAP_ROWS
    version = trainer.status.version
    assert not gate.due()
    assert not gate.due(trainer._deep_version, serving)
    assert trainer._maybe_swap(force=False) is False and trainer.status.version == version
    assert trainer._maybe_swap(force=True) is True  # a forced swap (stop) still judges
    assert trainer.status.version == version + 1
    gate.judge_seconds = 0.0
    assert gate.due()

    calls = []
    real = type(serving.current).logits

    def counting(snap, sources):
        calls.append(snap.version)
        return real(snap, sources)
    type(serving.current).logits = counting
    try:
        trainer._steps_since_swap += 1
        trainer._deep_version += 1
        d = gate.judge(trainer.model, trainer._deep_version, serving)
    finally:
        type(serving.current).logits = real
    assert calls == [], "the published candidate's logits were recomputed"
    assert d.published and d.candidate == d.serving  # same weights, same slice
    assert promotion.JUDGE_TIME_SHARE <= 0.5
    store.close()


def test_the_wide_paths_progress_is_judged_by_sparse_dots_not_held_back(tmp_path):
    """Between two transformer steps a candidate differs from what serves only in its wide
    weights: judging it runs a forward only for the held-back examples new to the slice,
    so the rationing of expensive judgements does not delay it (it did: ~370 signals)."""
    store, trainer, serving, events = _trained(tmp_path)
    gate = trainer.promotion
    trainer._steps_since_swap += 1
    assert trainer._maybe_swap(force=True) is True  # judged in full, published
    gate.judge_seconds, gate._judged_at = 3600.0, gate.clock()  # an expensive one just now
    trainer.model.params["wide.w"][...] *= 1.01
    trainer.wide_path.dirty = True
    assert gate.due(trainer._deep_version, serving)
    assert trainer._maybe_swap(force=False) is True

    rows = []
    real = type(serving.current).logits

    def counting(snap, sources):
        rows.append(len(sources["src"]))
        return real(snap, sources)
    type(serving.current).logits = counting
    try:
        before = {ex["seq"] for ex in gate.ring}
        n = trainer.status.last_trained_seq
        store.append_signals(_signals(16, start=1000))
        trainer._take(store.read_signals(n, 16))  # scored, learnt by the wide path
        new = [ex for ex in gate.ring if ex["seq"] not in before]
        assert 0 < len(new) <= 8  # a forward of 2 x 8 rows at most: cheap
        rows.clear()
        version = trainer.status.version
        assert gate.due(trainer._deep_version, serving)
        assert trainer._maybe_swap(force=False) is True and trainer.status.version == version + 1
    finally:
        type(serving.current).logits = real
    assert rows == [len(new)], "the serving model re-scored more than the new examples"
    assert gate.judge_seconds == 3600.0  # a cheap judgement is not rationed
    store.close()


def test_the_wide_paths_progress_is_published_while_a_new_transformer_waits(tmp_path):
    """After a transformer step the full judgement is a forward of the whole slice, rationed
    to its share of the trainer's time; meanwhile the wide path's progress is published
    beside the SERVING transformer, judged by sparse dots (the candidate published is the
    one judged), a worse one is refused, and a rollback restores the published weights.
    Without it flint on a 2-core CPU served weights 270-340 signals old."""
    from gated.engine.layout import slots

    store, trainer, serving, events = _trained(tmp_path)
    gate = trainer.promotion
    trainer._steps_since_swap += 1
    assert trainer._maybe_swap(force=True) is True  # judged in full, published
    before = serving.current.model.flat.copy()
    version = trainer.status.version
    token = serving.current.deep  # a new transformer published: a new token
    assert token is not None and store.published_info()["deep"] == token
    # a transformer step (its weights changed) whose judgement the time share defers
    trainer.model.params["gate.w"][...] *= 1.5
    trainer._deep_version += 1
    trainer._steps_since_swap += 1
    gate.judge_seconds, gate._judged_at = 3600.0, gate.clock()
    assert not gate.due(trainer._deep_version, serving)
    # ... while the wide path learned
    trainer.model.params["wide.w"][...] *= 1.01
    trainer.wide_path.dirty = True
    assert gate.due_wide(serving)
    assert trainer._maybe_swap(force=False) is True and trainer.status.version == version + 1
    assert events.decisions[-1]["reason"].startswith("the wide path's progress")

    flat = trainer.model.flat
    published_version, published, _ = store.load_published_head()
    assert published_version == version + 1
    wide = [s for s in slots(trainer.model.layout) if s.name.startswith("wide.")]
    assert wide
    is_wide = np.zeros(flat.size, dtype=bool)
    for s in wide:
        is_wide[s.offset:s.offset + s.size] = True
    for got in (published, serving.current.model.flat):
        np.testing.assert_array_equal(got[is_wide], flat[is_wide])  # the training wide path
        np.testing.assert_array_equal(got[~is_wide], before[~is_wide])  # serving's transformer
    assert not np.array_equal(flat[~is_wide], before[~is_wide])  # the new one still waits
    assert trainer._steps_since_swap >= 1 and not trainer.wide_path.dirty
    # the same transformer: the same token (a signal's served logit is still exact)
    assert serving.current.deep == token and store.published_info()["deep"] == token

    # a worse wide path is refused: serving keeps its version
    trainer.model.params["wide.w"][...] *= -50.0
    trainer.wide_path.dirty = True
    trainer.due_now()
    assert trainer._maybe_swap(force=False) is False
    assert trainer.status.version == version + 1 and serving.current.version == version + 1
    assert not events.decisions[-1]["published"]
    # a rollback goes back to what was published: serving's transformer, the published wide
    trainer._rollback("test")
    np.testing.assert_array_equal(trainer.model.flat, published)
    # published again in full (as after an operator's rollback): a token never seen
    assert trainer.publish_now() is True
    assert serving.current.deep not in (None, token)
    assert store.published_info()["deep"] == serving.current.deep
    store.close()


def test_the_wide_judgement_reuses_a_slice_a_few_examples_old(tmp_path, monkeypatch):
    """Judging the wide path's progress (about every second) rebuilds the slice's batch
    (~80 ms for 200 realistic sources) only once more than CHEAP_ROWS // 2 held-back
    examples joined it, or a correction relabelled one of them."""
    from gated.daemon.trainer import promotion

    store, trainer, serving, events = _trained(tmp_path)
    gate = trainer.promotion
    gate._slice(trainer.model.cfg)  # the slice's batch as it is now
    builds: list[int] = []
    real = promotion.source_batch
    monkeypatch.setattr(promotion, "source_batch",
                        lambda items, cfg: builds.append(len(items)) or real(items, cfg))

    def join(k: int, start: int) -> None:  # k held-back examples join the slice
        gate.add([dict(gate.ring[-1], seq=start + i) for i in range(k)])

    join(2, 10_000)
    assert gate.judge_wide(trainer.model, serving).published
    assert builds == []
    join(promotion.CHEAP_ROWS // 2, 10_100)
    gate.judge_wide(trainer.model, serving)
    assert builds == [len(gate.ring)]
    newest = gate.ring[-1]
    gate.relabel(newest["fp"], 1.0 - newest["label"])
    gate.judge_wide(trainer.model, serving)
    assert len(builds) == 2
    store.close()


def test_a_judgement_takes_turns_that_publish_only_the_wide_paths_progress(tmp_path):
    """A full judgement's forward runs TURN_ROWS rows at a time, and between two chunks the
    trainer takes the signals that arrived and publishes the wide path's progress beside
    the SERVING transformer -- never the candidate under judgement, which is published
    after its verdict; the judgement's rationed cost leaves the turns out. Why: flint's
    slice is ~4 s of forward on one core, and serving answered ~80 signals with the
    weights of before it."""
    from gated.daemon.trainer import promotion

    store, trainer, serving, events = _trained(tmp_path)
    gate = trainer.promotion
    now = [0.0]
    trainer.use_clock(lambda: now[0])
    trainer._steps_since_swap += 1
    assert trainer._maybe_swap(force=True) is True
    version = trainer.status.version
    trainer.model.params["gate.w"][...] *= 1.5  # a transformer step: the whole slice anew
    trainer._deep_version += 1
    trainer._steps_since_swap += 1
    assert len(gate.ring) > 2 * promotion.TURN_ROWS
    seen: list[tuple[int, bool]] = []

    def signal_arrives() -> None:  # the trainer's `before_turn`: a turn's first act
        now[0] += 100.0  # every turn takes 100 s of the clock
        seen.append((serving.current.version, np.array_equal(
            serving.current.model.params["gate.w"], trainer.model.params["gate.w"])))
        store.append_signals(_signals(2, start=1000 + 2 * len(seen)))
    trainer.before_turn = signal_arrives
    last, before = trainer.status.last_trained_seq, len(events.decisions)
    trainer.take_scores()  # what training scored before
    assert trainer._maybe_swap(force=False) is True
    turns = len(seen)
    # outside any step (an idle trainer's publication), the turns' signals were scored,
    # each once, for whoever counts them (bench/bench_learning.py lost them before)
    assert [seq for seq, *_ in trainer.take_scores()] == list(
        range(last + 1, trainer.status.last_trained_seq + 1))
    assert trainer.take_scores() == []
    assert turns >= len(gate.ring) // promotion.TURN_ROWS - 1
    assert trainer.status.last_trained_seq >= last + 2 * (turns - 1)  # taken in the turns
    assert not any(same for _, same in seen)  # the candidate never served before its verdict
    progress = [d for d in events.decisions[before:]
                if d["reason"].startswith("the wide path's")]
    assert len(progress) >= turns - 1  # each turn after the first found a dirty wide path
    assert seen[-1][0] > version + 1  # published in the turns, before the verdict
    assert not events.decisions[-1]["reason"].startswith("the wide path's")  # the verdict
    np.testing.assert_array_equal(serving.current.model.params["gate.w"],
                                  trainer.model.params["gate.w"])
    assert gate.judge_seconds < 100.0  # the turns' 100 s each are not the judgement's

    # a drift alarm in a turn drops the slice: the candidate is not judged on the old labels
    trainer.model.params["gate.w"][...] *= 1.5
    trainer._deep_version += 1
    trainer._steps_since_swap += 1
    trainer.before_turn = lambda: gate.forget(trainer.status.last_trained_seq)
    assert trainer._maybe_swap(force=True) is True
    assert "dropped by a drift alarm" in events.decisions[-1]["reason"]
    store.close()
