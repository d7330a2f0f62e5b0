"""The wide path's features: hashed byte n-grams of the current call and of the history.

A linear logit over these (``wide.w``, see model.py) learns from the first signals on,
while the transformer is still slow; its gradient is exact (a scatter-add). The call and
the history are hashed with different salts, so ``.env`` in the history and ``.env`` in
the call are different features, and each segment's count vector is L2-normalised on its
own, so a long history does not dilute the call.

The hash is a 64-bit multiply-xor over the n-gram's token ids (FNV-1a's constants), fully
vectorised with NumPy; it is stable across runs and machines (no Python ``hash``), so a
checkpoint's wide weights mean the same after a restart.
"""

from __future__ import annotations

import numpy as np

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_MIX = np.uint64(0x9E3779B97F4A7C15)


def _segment_features(ids: np.ndarray, segment: int, n_max: int,
                      buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """(bucket ids, L2-normalised counts) of the 1..n_max-grams of one segment's ids."""
    length = ids.shape[0]
    hashes = []
    for n in range(1, min(n_max, length) + 1):
        salt = np.uint64(_FNV_OFFSET ^ np.uint64(n * 0x100 + segment))
        h = np.full(length - n + 1, salt, dtype=np.uint64)
        for k in range(n):
            h ^= ids[k: length - n + 1 + k]
            h *= _FNV_PRIME
        hashes.append(h)
    if not hashes:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    h = np.concatenate(hashes) * _MIX  # spread the low bits before the modulo
    idx, counts = np.unique((h >> np.uint64(29)) % np.uint64(buckets), return_counts=True)
    val = counts.astype(np.float64)
    return idx.astype(np.int64), val / np.sqrt(np.dot(val, val))


def wide_features(ids: list[int], segs: list[int], n_max: int,
                  buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """Sparse features of one encoded source: (bucket ids [K], values [K]).

    Segment 0 is the current call, segment 1 the history (SEP tokens included, so an
    n-gram can mark an entry's start). A bucket hit by both segments appears twice; the
    linear logit sums both terms, which is what a dense vector with that bucket's total
    would give.
    """
    arr = np.asarray(ids, dtype=np.uint64)
    seg = np.asarray(segs)
    parts = [_segment_features(arr[seg == s], s, n_max, buckets) for s in (0, 1)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def pad_features(feats: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of sparse features as dense [B, K] (bucket 0, value 0 where padded: adds 0)."""
    k = max(1, max((f[0].shape[0] for f in feats), default=0))
    idx = np.zeros((len(feats), k), dtype=np.int64)
    val = np.zeros((len(feats), k), dtype=np.float64)
    for i, (fi, fv) in enumerate(feats):
        idx[i, : fi.shape[0]] = fi
        val[i, : fv.shape[0]] = fv
    return idx, val
