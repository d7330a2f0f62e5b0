"""The serving side: an immutable (version, weights) snapshot swapped by one reference,
an exact prediction cache, and a micro-batcher.

Training never writes into a snapshot's weights: a swap builds a NEW snapshot from a copy
of the trained buffer (in the daemon: the version the trainer process published in LMDB)
and rebinds `Serving.current`. A prediction reads `current` once, so it sees the old or
the new weights, never a mix, and it never takes a lock the trainer holds.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..engine import Model, ModelConfig, source_batch
from ..engine.infer import InferencePlan
from ..engine.wide import NGRAM_END, without_wide
from ..online.calibration import platt_map


@dataclass(frozen=True)
class Bands:
    """Confidence bands: allow (p >= allow), block (p <= block), ask in between."""

    allow: float = 0.9
    block: float = 0.1

    def of(self, p_allow: float, allow_open: bool = True) -> str:
        """The band of `p_allow`; with `allow_open` False (the trainer's evidence does not
        yet back an allow: `Monitor.allow_band_open`) a would-be allow is `ask`."""
        if p_allow >= self.allow:
            return "allow" if allow_open else "ask"
        if p_allow <= self.block:
            return "block"
        return "ask"


@dataclass(frozen=True)
class Calibration:
    """p_allow = sigmoid(a z + d z_deep + b) over the gate logit z and its transformer
    part z_deep: Platt scaling with the transformer's share, fitted by the trainer on the
    progressive-validation stream (gated.online.calibration) and swapped in by one
    reference assignment, like the weights. `allow_open`: whether the same stream backs
    answering `allow` yet (gated.online.monitor `Monitor.allow_band_open`). `familiar`:
    whether the wide path's byte n-grams are read scaled by their familiarity
    (`ModelConfig.wide_familiarity`); the trainer turns it off while its wide learner
    adapts to a drift alarm (`train.drift_wide_unscaled_examples`), when the new policy's
    first blocks are learned on n-grams the scaling would read less."""

    a: float = 1.0
    b: float = 0.0
    d: float = 0.0
    allow_open: bool = True
    familiar: bool = True

    def __call__(self, z: np.ndarray, z_deep: np.ndarray | float = 0.0) -> np.ndarray:
        return platt_map(z, z_deep, self.a, self.b, self.d)

    def as_list(self) -> list:
        """What a published version stores (LMDB, the cluster's snapshot): `Calibration(
        *as_list())` is this calibration again; a stored list without the later fields
        takes their defaults."""
        return [float(self.a), float(self.b), float(self.d), bool(self.allow_open),
                bool(self.familiar)]

    def reads(self, sources: dict) -> dict:
        """`sources` (a `source_batch`) as this calibration has the model read them:
        without where the n-grams end (so unscaled) while `familiar` is off."""
        if self.familiar or NGRAM_END not in sources:
            return sources
        return {k: v for k, v in sources.items() if k != NGRAM_END}

    def of(self, z: np.ndarray, sources: dict, model: Model,
           z_deep: np.ndarray | None = None) -> np.ndarray:
        """Calibrated p_allow of logits `z` that `model` gave for `sources` (the wide
        part, a sparse dot, is subtracted only when the transformer's share is in use;
        `z_deep`, where the caller has it already, saves computing it again)."""
        if not self.d or "wide.w" not in model.params:  # without a wide path: all deep, d 0
            return self(z)
        if z_deep is None:
            z_deep = np.asarray(z, np.float64) - model.wide_logit(sources)
        return self(z, z_deep)


class Scored(NamedTuple):
    """A batch scored as serving scores it, with the parts the trainer learns from."""

    z: np.ndarray  # raw gate logits (float64)
    z_deep: np.ndarray  # their transformer part: z minus the wide path's share
    p: np.ndarray  # calibrated p_allow, as `predict` answers
    snapshot: Snapshot  # the version that scored them
    sources: dict  # the batch as that calibration reads it (`Calibration.reads`)
    reused: int = 0  # rows whose transformer logit came from `served` (not recomputed)


@dataclass(frozen=True)
class Snapshot:
    version: int
    step: int
    model: Model  # owns a private copy of the weights; never mutated after publication
    #: the same weights arranged for the CPU forward (engine/infer.py); None on a GPU
    plan: InferencePlan | None = None
    #: which transformer this is: a random token drawn when the trainer publishes new
    #: transformer weights, kept by a publication of the wide path's progress beside them
    #: (None: unknown). Equal tokens, equal transformer logits (`ServedDeep`).
    deep: int | None = None

    @classmethod
    def of(cls, cfg: ModelConfig, flat, version: int, step: int, backend: str,
           deep: int | None = None) -> Snapshot:
        model = Model.from_flat(cfg, flat, backend=backend)
        return cls(version, step, model, InferencePlan(model) if backend == "numpy" else None,
                   deep)

    def logits(self, sources: dict, chunk: int = 16) -> np.ndarray:
        """Gate logits (float64, host) of a `source_batch`, in length-sorted chunks."""
        return (self.model if self.plan is None else self.plan).predict_z(sources, chunk)


log = logging.getLogger("gated.serving")


class PredictionCache:
    """Exact predictions, keyed by (weights version, context, history): agents repeat tool
    calls. Bounded LRU; `clear` on a swap frees what the old version cached (its keys could
    never hit again anyway)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.hits = self.misses = 0
        self._d: OrderedDict[tuple, float] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(version: int, context: str, history: Sequence[str] | None) -> tuple:
        return (version, context, tuple(history or ()))

    def get(self, key: tuple) -> float | None:
        if self.size <= 0:
            return None
        with self._lock:
            p = self._d.get(key)
            if p is None:
                self.misses += 1
                return None
            self._d.move_to_end(key)
            self.hits += 1
            return p

    def peek(self, key: tuple) -> float | None:
        """Like `get`, without counting a lookup or refreshing the entry."""
        if self.size <= 0:
            return None
        with self._lock:
            return self._d.get(key)

    def put(self, key: tuple, p_allow: float) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._d[key] = p_allow
            self._d.move_to_end(key)
            while len(self._d) > self.size:
                self._d.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()

    def __len__(self) -> int:
        return len(self._d)


class ServedDeep:
    """The transformer's part of the logits serving computed lately, by call: (the
    snapshot's `deep` token, z_deep). At ingest a signal for a call served this way
    carries them into the signal log (`served`), and the trainer, scoring that signal
    with a snapshot of the same token, reuses the logit instead of running the
    transformer again: the same weights on the same bytes, so the same number (up to the
    float rounding of another batch); the forward it saves was ~40% of the trainer's time
    on a 2-core CPU (docs/learning.md).

    Keyed by the call's exact text (`key`: Python's hash, salted per process, and the
    lengths), not by `context_fingerprint`, which folds whitespace the transformer reads,
    and costs a BLAKE2b per signal on the ingest path. Bounded LRU of small keys: a
    client's long calls cost it nothing; `size` 0 turns it off."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._d: OrderedDict[tuple, tuple[int, float]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(context: str, history: Sequence[str] | None) -> tuple:
        hist = tuple(history or ())
        return (hash(context), len(context), hash(hist), len(hist))

    def note(self, items: Sequence[tuple[str, Sequence[str] | None]], deep: int | None,
             z_deep: np.ndarray) -> None:
        """Remember what the snapshot with token `deep` gave for each (context, history)."""
        if self.size <= 0 or deep is None:
            return
        keys = [self.key(c, h) for c, h in items]
        with self._lock:
            for k, zd in zip(keys, z_deep, strict=True):
                self._d[k] = (deep, float(zd))
                self._d.move_to_end(k)
            while len(self._d) > self.size:
                self._d.popitem(last=False)

    def attach(self, signals: list[dict]) -> int:
        """Set `served` on each validated signal whose call was served lately; how many."""
        if self.size <= 0 or not self._d:
            return 0
        keys = [self.key(sig["context"], sig.get("history")) for sig in signals]
        found = 0
        with self._lock:
            for sig, k in zip(signals, keys, strict=True):
                got = self._d.get(k)
                if got is not None:
                    sig["served"] = got
                    found += 1
        return found

    def __len__(self) -> int:
        return len(self._d)


class Serving:
    """Holds the current snapshot and answers predict / explain from it."""

    def __init__(self, cfg: ModelConfig, flat: np.ndarray, version: int, step: int,
                 backend: str = "numpy", bands: Bands | None = None,
                 cache_size: int = 0, deep: int | None = None,
                 served_size: int = 0) -> None:
        self.cfg, self.backend = cfg, backend
        self.bands = bands or Bands()
        self.calibration = Calibration()
        self.cache = PredictionCache(cache_size)
        self.served = ServedDeep(served_size)
        self.current = Snapshot.of(cfg, flat, version, step, backend, deep)

    def swap(self, flat, version: int, step: int,
             calibration: Calibration | None = None, deep: int | None = None) -> Snapshot:
        """Publish a copy of `flat` as the new snapshot: one reference assignment (the
        calibration that goes with it first, so no prediction pairs new weights with an
        old map for long). `deep`: its transformer's token (`Snapshot.deep`)."""
        snap = Snapshot.of(self.cfg, flat, version, step, self.backend, deep)
        if calibration is not None:
            self.calibration = calibration
        self.current = snap
        self.cache.clear()
        return snap

    def load_published(self, store) -> Snapshot | None:
        """Swap in the version the trainer published in `store`, if it is newer than the
        one serving (one read transaction: weights and head are consistent)."""
        head = store.published_info()  # a small read: the daemon asks every tick
        if head is None or int(head["version"]) == self.current.version:
            return None
        got = store.load_published_head()
        if got is None or got[0] == self.current.version:
            return None
        info = got[2]
        cal = info.get("calibration")
        return self.swap(got[1], got[0], int(info.get("step", 0)),
                         Calibration(*cal) if cal else None, info.get("deep"))

    def move_to(self, backend: str, flat=None) -> Snapshot:
        """Rebuild the current snapshot on `backend` (the GPU -> CPU fallback), same
        version and step. `flat` (host weights) replaces reading the current ones back,
        for when the device they are on no longer answers. Later swaps use `backend`."""
        snap = self.current
        if flat is None:
            flat = snap.model.ops.to_numpy(snap.model.flat)
        new = Snapshot.of(self.cfg, flat, snap.version, snap.step, backend, snap.deep)
        self.backend = backend
        self.current = new
        return new

    def score_many(self, items: Sequence[tuple[str, Sequence[str] | None]]
                   ) -> tuple[np.ndarray, np.ndarray, Snapshot]:
        """(raw gate logits, calibrated p_allow, snapshot) for (context, history) pairs."""
        return self.score_sources(source_batch(items, self.cfg))

    def score_sources(self, sources: dict) -> tuple[np.ndarray, np.ndarray, Snapshot]:
        """`score_many` for a `source_batch` the caller already built."""
        scored = self.score_parts(sources)
        return scored.z, scored.p, scored.snapshot

    def score_parts(self, sources: dict,
                    served: Sequence[tuple[int, float] | None] | None = None) -> Scored:
        """`score_sources` with the transformer's part of each logit: the transformer's
        forward without the wide features and the wide path's share, each computed once
        and added (the trainer's progressive validation and what its wide learner learns
        from; calibration's transformer share; the benchmark's probes).

        `served` (per row, from the signal log: `ServedDeep`): where a row's token is this
        snapshot's, its transformer logit is taken from there and only the wide path's
        share is computed; the transformer runs on the other rows alone."""
        snap, cal = self.current, self.calibration
        sources = cal.reads(sources)
        wide = snap.model.wide_logit(sources)
        known = ([] if not served or snap.deep is None else
                 [i for i, s in enumerate(served) if s is not None and s[0] == snap.deep])
        deep_sources = without_wide(sources)
        if not known:
            z_deep = snap.logits(deep_sources)
        else:
            z_deep = np.empty_like(wide)
            z_deep[known] = [served[i][1] for i in known]  # type: ignore[index]
            rest = np.setdiff1d(np.arange(wide.size), known)
            if rest.size:
                z_deep[rest] = snap.logits({k: np.asarray(v)[rest]
                                            for k, v in deep_sources.items()})
        z = z_deep + wide
        return Scored(z, z_deep, cal.of(z, sources, snap.model, z_deep), snap, sources,
                      len(known))

    def predict_many(self, items: Sequence[tuple[str, Sequence[str] | None]]
                     ) -> tuple[np.ndarray, Snapshot]:
        """Calibrated p_allow for (context, history) pairs, and the snapshot that served;
        the transformer's logits are remembered for the signals to come (`ServedDeep`)."""
        scored = self.score_parts(source_batch(items, self.cfg))
        if self.served.size > 0:
            self.served.note(items, scored.snapshot.deep, scored.z_deep)
        return scored.p, scored.snapshot

    def predict(self, context: str, history: Sequence[str] | None = None) -> dict:
        p, snap = self.predict_many([(context, history)])
        return self.reply(float(p[0]), snap.version)

    def reply(self, p_allow: float, version: int) -> dict:
        return {"p_allow": p_allow, "band": self.band(p_allow), "version": version}

    def band(self, p_allow: float) -> str:
        """The band serving answers for a calibrated `p_allow` now."""
        return self.bands.of(p_allow, self.calibration.allow_open)

    def cached(self, context: str, history: Sequence[str] | None) -> dict | None:
        """The reply from the cache, or None (then ask the `MicroBatcher`)."""
        version = self.current.version
        p = self.cache.get(PredictionCache.key(version, context, history))
        return None if p is None else self.reply(p, version)

    def explain(self, context: str, history: Sequence[str] | None = None,
                max_len: int = 64) -> dict:
        snap, cal = self.current, self.calibration
        src = cal.reads(source_batch([(context, history)], self.cfg))
        p_raw, reason = snap.model.predict_and_decode(src, max_len=max_len)
        if 0.0 < p_raw < 1.0:
            p = float(cal.of(np.array([np.log(p_raw) - np.log1p(-p_raw)]), src, snap.model)[0])
        else:
            p = p_raw
        return {"p_allow": p, "band": self.band(p), "reason": reason,
                "version": snap.version}


class MicroBatcher:
    """Predictions arriving together share one forward pass.

    One thread runs forwards, one at a time. It takes the oldest request, then every
    request already queued, then waits at most `wait_s` for more (0: none), up to
    `max_batch`; requests that arrive while a forward runs are batched into the next one
    anyway. The thread's replies go through `Future`s. Each result is cached under the
    version that computed it.
    """

    def __init__(self, serving: Serving, wait_s: float = 0.0, max_batch: int = 32,
                 on_batch=None) -> None:
        self.serving, self.wait_s, self.max_batch = serving, wait_s, max(1, max_batch)
        self.on_batch = on_batch or (lambda n: None)
        self.batches = self.batched = 0  # forwards run, requests they answered
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="gated-predict", daemon=True)
        self._thread.start()

    def submit(self, context: str, history: Sequence[str] | None) -> Future:
        fut: Future = Future()
        self._q.put((context, history, fut))
        return fut

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(5.0)

    def _take(self) -> list | None:
        first = self._q.get()
        if first is None:
            return None
        items = [first]
        while len(items) < self.max_batch:
            try:
                nxt = self._q.get_nowait()
            except queue.Empty:
                if self.wait_s <= 0:
                    break
                try:
                    nxt = self._q.get(timeout=self.wait_s)
                except queue.Empty:
                    break
            if nxt is None:
                self._q.put(None)
                break
            items.append(nxt)
        return items

    def _run(self) -> None:
        while True:
            items = self._take()
            if items is None:
                return
            try:
                p, snap = self.serving.predict_many([(c, h) for c, h, _ in items])
            except Exception as e:  # noqa: BLE001 - answered as an error, serving goes on
                log.exception("a predict forward pass failed")
                for _, _, fut in items:
                    fut.set_exception(e)
                continue
            self.batches += 1
            self.batched += len(items)
            self.on_batch(len(items))
            for (c, h, fut), pi in zip(items, p, strict=True):
                pi = float(pi)
                self.serving.cache.put(PredictionCache.key(snap.version, c, h), pi)
                fut.set_result(self.serving.reply(pi, snap.version))
