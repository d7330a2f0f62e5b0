"""Checkpoints (the trainer's whole state, committed by one head) and published snapshots.

``ckpt`` database: ``b"head"`` (msgpack: step, last trained seq, layout, config
fingerprint, dtype, EWC shapes, extra, and the generation its arrays are stored under)
and the raw arrays ``flat``, ``m``, ``v``, ``ewc/<name>`` of that generation, in pieces of
at most `PIECE_BYTES` (``b"g<gen>/<name>/<i>"``). A save writes a NEW generation's pieces,
a transaction per piece, then one small transaction switches the head to it and deletes
the old generation: after a kill -9 the head names a complete generation (weights, AdamW
moments, step and EWC state of the same step), and the pieces of a save that died are
deleted by the next one. Why pieces: LMDB has one writer, and flint's 90 MB in one
transaction held it 0.3-0.4 s, during which no signal could be committed (signal acks
waited up to ~0.5 s in bench/bench_live.py); a piece holds it ~10-30 ms.
Checkpoints written before pieces (the arrays under ``b"flat"``, ... and no generation in
the head) still load; the first save after them deletes those keys.

``published`` database: ``b"current"`` -> version, ``b"h" + u64(version)`` -> head,
``b"v" + u64(version)`` -> raw weights. Readers (other processes) read head and weights in
one read transaction: a consistent (version, weights) pair, never a mix.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lmdb
import numpy as np

from .base import StoreBase
from .codec import from_u64, pack, u64, unpack
from .env import acquire, current, release
from .errors import CheckpointMismatch, StoreError

log = logging.getLogger("gated.store")

Layout = list[tuple[str, tuple[int, ...]]]

_WAY_OUT = ("To start from fresh weights and keep every stored signal, run `gated run "
            "--reinit`; to keep this checkpoint, run with the model config it was written "
            "for, or point --state-dir elsewhere.")


@dataclass
class Checkpoint:
    """A loaded checkpoint; arrays are fresh, writable NumPy copies."""

    flat: np.ndarray
    m: np.ndarray
    v: np.ndarray
    step: int
    last_trained_seq: int
    layout: Layout
    config_fingerprint: str
    ewc: dict[str, np.ndarray] | None
    extra: dict[str, Any] | None
    dtype: str = "float32"
    saved_at: float = 0.0


def normalize_layout(layout: Sequence[tuple[str, Sequence[int]]]) -> Layout:
    return [(str(name), tuple(int(d) for d in shape)) for name, shape in layout]


#: Bytes of a checkpoint array per write transaction (see the module's docstring).
PIECE_BYTES = 8 << 20


def _piece_key(gen: int, name: str, i: int) -> bytes:
    return f"g{gen:016x}/{name}/{i:06d}".encode()


def _gen_prefix(gen: int) -> bytes:
    return f"g{gen:016x}/".encode()


#: 2 (2026-11-23): the source encoding and gate of DESIGN.md 1's revision (a segment
#: embedding, a gate over the pooled call and history, the wide path's weights; AdamW's
#: v carries the wide path's AdaGrad sums). Format 1 checkpoints are refused by name.
CHECKPOINT_FORMAT = 2


def _n_params(layout: Layout) -> int:
    return sum(int(np.prod(shape, dtype=np.int64)) for _, shape in layout)


def _describe_layout(layout: Layout) -> str:
    return f"{len(layout)} tensors, {_n_params(layout):,} parameters"


def _mismatch_message(path: str, stored_fp: str, stored_layout: Layout, want_fp: str,
                      want_layout: Layout) -> str:
    parts = [f"the checkpoint in {path} does not fit the model this daemon runs:"]
    parts.append(f"config fingerprint stored={stored_fp!r} running={want_fp!r}"
                 + ("" if stored_fp != want_fp else " (same)") + ";")
    if stored_layout == want_layout:
        parts.append(f"layout is the same ({_describe_layout(want_layout)}).")
    else:
        where = ""
        for i, (a, b) in enumerate(zip(stored_layout, want_layout, strict=False)):
            if a != b:
                where = (f" first difference at tensor #{i}: stored {a[0]} {list(a[1])} vs "
                         f"running {b[0]} {list(b[1])}")
                break
        else:
            where = " one layout is a prefix of the other"
        parts.append(f"layout stored: {_describe_layout(stored_layout)}; running: "
                     f"{_describe_layout(want_layout)};{where}.")
    parts.append("Refusing to load weights that would be silently wrong. " + _WAY_OUT)
    return " ".join(parts)


def _flat_array(name: str, a: Any) -> np.ndarray:
    arr = np.ascontiguousarray(a)
    if arr.dtype.kind != "f":
        raise TypeError(f"checkpoint array {name!r} must be floating point, got {arr.dtype}")
    return arr


def _copy_out(bufs: Sequence[memoryview | bytes], dtype: str,
              shape: Sequence[int]) -> np.ndarray:
    """One copy straight from the LMDB map (an array's buffers in order: one, or a
    checkpoint's pieces) into a fresh, writable array."""
    out = np.empty(tuple(shape), dtype=np.dtype(dtype))
    srcs = [np.frombuffer(buf, dtype=np.uint8) for buf in bufs]
    stored = sum(src.size for src in srcs)
    if stored != out.nbytes:
        raise StoreError(f"stored array has {stored} bytes, expected {out.nbytes}: the "
                         "state is damaged; restore a backup (`gated backup`) or --reinit")
    dst, at = out.reshape(-1).view(np.uint8), 0
    for src in srcs:
        dst[at:at + src.size] = src
        at += src.size
    return out


def _read_published(h: Any, txn: lmdb.Transaction) -> tuple[int, np.ndarray, dict] | None:
    db = h.db("published")
    if db is None:
        return None
    cur = txn.get(b"current", db=db)
    if cur is None:
        return None
    version = from_u64(cur)
    head = txn.get(b"h" + cur, db=db)
    blob = txn.get(b"v" + cur, db=db)
    if head is None or blob is None:
        raise StoreError(f"published version {version} is incomplete in {h.path}")
    info = unpack(head)
    return version, _copy_out([blob], info["dtype"], (info["n"],)), info


class Checkpoints(StoreBase):
    """`save_checkpoint` / `load_checkpoint`, `publish` / `load_published`."""

    def save_checkpoint(self, *, flat: np.ndarray, m: np.ndarray, v: np.ndarray, step: int,
                        last_trained_seq: int, layout: Sequence[tuple[str, Sequence[int]]],
                        config_fingerprint: str, ewc: Mapping[str, np.ndarray] | None = None,
                        extra: Mapping[str, Any] | None = None) -> None:
        """Commit the trainer's whole state: its arrays a piece per transaction, then the
        head that names them in one (returns after that commit; the module says why).

        ``extra`` must be msgpack-serialisable (numbers, strings, lists, dicts).
        """
        lay = normalize_layout(layout)
        arrays = {"flat": _flat_array("flat", flat), "m": _flat_array("m", m),
                  "v": _flat_array("v", v)}
        n = arrays["flat"].size
        for name, arr in arrays.items():
            if arr.ndim != 1 or arr.size != n or arr.dtype != arrays["flat"].dtype:
                raise ValueError(f"checkpoint array {name!r} is {arr.dtype}{list(arr.shape)}; "
                                 f"flat, m and v must be 1-D {arrays['flat'].dtype}[{n}]")
        if lay and _n_params(lay) != n:
            raise ValueError(f"layout describes {_n_params(lay)} parameters, flat has {n}")
        ewc_arrays = {str(k): _flat_array(f"ewc/{k}", a) for k, a in (ewc or {}).items()}
        named = {**arrays, **{f"ewc/{k}": a for k, a in ewc_arrays.items()}}
        raw = {name: a.reshape(-1).view(np.uint8) for name, a in named.items()}
        what = f"checkpoint of step {step}"
        # the committed head's generation; the pieces of a save that died before its head
        # (none, normally) are deleted in the same transaction
        gen = (self._h.write(self._drop_dead_pieces, what=what) or 0) + 1
        head = {"format": CHECKPOINT_FORMAT, "step": int(step),
                "last_trained_seq": int(last_trained_seq),
                "layout": [[name, list(shape)] for name, shape in lay],
                "config_fingerprint": str(config_fingerprint),
                "dtype": arrays["flat"].dtype.str, "n": int(n),
                "ewc": {k: [a.dtype.str, list(a.shape)] for k, a in ewc_arrays.items()},
                "extra": dict(extra) if extra is not None else None, "saved_at": time.time(),
                "gen": gen, "pieces": {name: max(1, -(-b.size // PIECE_BYTES))
                                       for name, b in raw.items()}}
        head_bytes = pack(head)
        for name, b in raw.items():
            for i in range(head["pieces"][name]):
                piece = b[i * PIECE_BYTES:(i + 1) * PIECE_BYTES]

                def put(txn: lmdb.Transaction, key: bytes = _piece_key(gen, name, i),
                        piece: np.ndarray = piece) -> None:
                    txn.put(key, piece, db=self._db("ckpt"))
                self._h.write(put, what=what)

        def switch(txn: lmdb.Transaction) -> None:
            db = self._db("ckpt")
            txn.put(b"head", head_bytes, db=db)
            self._delete_generations(txn, keep=gen, legacy=True)
            self._meta_put_int(txn, b"step", int(step))
            self._meta_put_int(txn, b"last_trained_seq", int(last_trained_seq))
            txn.put(b"config_fingerprint", str(config_fingerprint).encode(),
                    db=self._db("meta"))

        self._write_with_metrics(switch, what=what)

    def _drop_dead_pieces(self, txn: lmdb.Transaction) -> int | None:
        """Delete the pieces no committed head names; returns the generation the head
        names (None: no checkpoint, or one written before pieces)."""
        raw = txn.get(b"head", db=self._db("ckpt"))
        gen = unpack(raw).get("gen") if raw is not None else None
        self._delete_generations(txn, keep=gen, legacy=False)
        return gen

    def _delete_generations(self, txn: lmdb.Transaction, keep: int | None,
                            legacy: bool) -> None:
        """Delete the pieces of every generation but `keep` (older ones, a dead save's)
        and, with `legacy`, the arrays written before pieces: only once a head no longer
        names them."""
        db = self._db("ckpt")
        kept = _gen_prefix(keep) if keep is not None else None
        doomed = [k for k in txn.cursor(db=db).iternext(keys=True, values=False)
                  if k != b"head" and not (kept and k.startswith(kept))
                  and (legacy or k.startswith(b"g"))]
        for k in doomed:
            txn.delete(k, db=db)

    def checkpoint_info(self) -> dict[str, Any] | None:
        """The checkpoint's head (step, last trained seq, fingerprint, ...) without arrays."""
        def fn(txn: lmdb.Transaction) -> dict[str, Any] | None:
            db = self._h.db("ckpt")
            raw = txn.get(b"head", db=db) if db is not None else None
            return unpack(raw) if raw is not None else None
        return self._h.read(fn)

    def load_checkpoint(self, *, layout: Sequence[tuple[str, Sequence[int]]],
                        config_fingerprint: str) -> Checkpoint | None:
        """The committed checkpoint, or None when there is none.

        Raises `CheckpointMismatch` (naming both sides and the way out) when it was written
        for another layout or config: never silently wrong weights.
        """
        want = normalize_layout(layout)

        def fn(txn: lmdb.Transaction) -> Checkpoint | None:
            db = self._h.db("ckpt")
            raw = txn.get(b"head", db=db) if db is not None else None
            if raw is None:
                return None
            head = unpack(raw)
            if head.get("format", 1) != CHECKPOINT_FORMAT:
                raise CheckpointMismatch(
                    f"the checkpoint in {self.path} has format {head.get('format', 1)}; this "
                    f"daemon reads format {CHECKPOINT_FORMAT} (source encoding 2: the call "
                    "first, history abbreviated, a wide n-gram path; docs/design.md), whose "
                    "weights cannot be derived from the old ones. Start with --reinit to "
                    "train a fresh model (every signal stays in the log; `gated backup` "
                    "first to keep the old weights)")
            stored = normalize_layout(head["layout"])
            if stored != want or head["config_fingerprint"] != config_fingerprint:
                raise CheckpointMismatch(_mismatch_message(
                    self.path, head["config_fingerprint"], stored, config_fingerprint, want))

            gen = head.get("gen")

            def get(name: str, dtype: str, shape: Sequence[int]) -> np.ndarray:
                keys = ([name.encode()] if gen is None  # written before pieces
                        else [_piece_key(gen, name, i) for i in range(head["pieces"][name])])
                bufs = [txn.get(key, db=db) for key in keys]
                for key, buf in zip(keys, bufs, strict=True):
                    if buf is None:
                        raise StoreError(f"checkpoint in {self.path} lacks {key.decode()}: "
                                         "the state is damaged; restore a backup or --reinit")
                return _copy_out(bufs, dtype, shape)

            n, dt = head["n"], head["dtype"]
            ewc = {k: get(f"ewc/{k}", d, s) for k, (d, s) in head["ewc"].items()}
            return Checkpoint(flat=get("flat", dt, (n,)), m=get("m", dt, (n,)),
                              v=get("v", dt, (n,)), step=head["step"],
                              last_trained_seq=head["last_trained_seq"], layout=stored,
                              config_fingerprint=head["config_fingerprint"],
                              ewc=ewc or None, extra=head.get("extra"),
                              dtype=np.dtype(dt).name, saved_at=head.get("saved_at", 0.0))
        return self._h.read(fn, buffers=True)

    # --- published snapshots -------------------------------------------------------------------
    def publish(self, version: int, flat: np.ndarray, *, step: int, keep: int = 3,
                extra: dict[str, Any] | None = None) -> None:
        """Commit weights as published ``version`` and make it current; keep the newest
        ``keep`` versions. A version not above the current one (after --reinit) replaces
        the history from that version on. ``extra`` (msgpack-able, e.g. the calibration
        that goes with these weights) is stored in the version's head: `published_info`."""
        arr = _flat_array("published", flat).reshape(-1)
        head = pack({**(extra or {}), "version": int(version), "step": int(step),
                     "dtype": arr.dtype.str, "n": int(arr.size), "saved_at": time.time()})
        keep = max(1, keep)

        def fn(txn: lmdb.Transaction) -> bool:
            db = self._db("published")
            cur_raw = txn.get(b"current", db=db)
            rewound = cur_raw is not None and from_u64(cur_raw) >= version
            versions = self._published_versions(txn)
            if rewound:
                for old in versions:
                    if old >= version:
                        txn.delete(b"h" + u64(old), db=db)
                        txn.delete(b"v" + u64(old), db=db)
                versions = [x for x in versions if x < version]
            txn.put(b"h" + u64(version), head, db=db)
            txn.put(b"v" + u64(version), arr.view(np.uint8), db=db)
            txn.put(b"current", u64(version), db=db)
            for old in (versions + [version])[:-keep]:
                txn.delete(b"h" + u64(old), db=db)
                txn.delete(b"v" + u64(old), db=db)
            self._meta_put_int(txn, b"published_version", int(version))
            return rewound

        if self._write_with_metrics(fn, what=f"publishing weights version {version}"):
            log.warning("published version %d is not above the stored current version (a "
                        "--reinit?); later stored versions were dropped", version)

    def _published_versions(self, txn: lmdb.Transaction) -> list[int]:
        db = self._h.db("published")
        if db is None:
            return []
        cur = txn.cursor(db=db)
        out = []
        if cur.set_range(b"h"):
            for key in cur.iternext(keys=True, values=False):
                if not key.startswith(b"h"):
                    break
                out.append(from_u64(key[1:]))
        return out

    def load_published(self) -> tuple[int, np.ndarray] | None:
        """The current published (version, weights), read in one transaction."""
        got = self.load_published_head()
        return None if got is None else (got[0], got[1])

    def load_published_head(self) -> tuple[int, np.ndarray, dict[str, Any]] | None:
        """The current published (version, weights, head) -- step, calibration and the
        rest of `publish`'s ``extra`` -- all three from one read transaction."""
        return self._h.read(lambda txn: _read_published(self._h, txn), buffers=True)

    def load_published_version(self, version: int) -> np.ndarray | None:
        """The weights of a kept published `version` (None when it is no longer kept)."""
        def fn(txn: lmdb.Transaction) -> np.ndarray | None:
            db = self._h.db("published")
            head = txn.get(b"h" + u64(version), db=db) if db is not None else None
            blob = txn.get(b"v" + u64(version), db=db) if db is not None else None
            if head is None or blob is None:
                return None
            info = unpack(head)
            return _copy_out([blob], info["dtype"], (info["n"],))
        return self._h.read(fn, buffers=True)

    def published_info(self) -> dict[str, Any] | None:
        """Current published version's head plus the versions kept."""
        def fn(txn: lmdb.Transaction) -> dict[str, Any] | None:
            db = self._h.db("published")
            cur = txn.get(b"current", db=db) if db is not None else None
            if cur is None:
                return None
            info = unpack(txn.get(b"h" + cur, db=db))
            info["kept"] = self._published_versions(txn)
            return info
        return self._h.read(fn)


def load_published(state_dir: str | os.PathLike[str], with_head: bool = False
                   ) -> tuple[int, np.ndarray] | tuple[int, np.ndarray, dict] | None:
    """Current (version, weights) published in ``state_dir``, from any process; with
    `with_head`, (version, weights, head): the head holds the step and the calibration
    those weights are served with.

    Uses the environment this process already has open for ``state_dir`` if any, else a
    cached read-only one (LMDB allows one environment per file per process). Consistent:
    head and weights are read in one read transaction. Copes with the writer growing the
    map meanwhile. Returns None when nothing was published (or there is no state yet).
    """
    h = current(state_dir)
    if h is not None:
        got = h.read(lambda txn: _read_published(h, txn), buffers=True)
        return None if got is None else (got if with_head else (got[0], got[1]))
    if not os.path.exists(os.path.join(os.fspath(state_dir), "data.mdb")):
        return None
    h = acquire(state_dir, readonly=True)
    try:
        got = h.read(lambda txn: _read_published(h, txn), buffers=True)
    finally:
        release(h, keep_open=True)
    return None if got is None else (got if with_head else (got[0], got[1]))
