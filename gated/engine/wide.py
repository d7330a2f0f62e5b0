"""The wide path's features: hashed byte n-grams of the current call and of the history.

A linear logit over these (``wide.w``, see model.py) learns from the first signals on,
while the transformer is still slow; its gradient is exact (a scatter-add). The call and
the history are hashed with different salts, so ``.env`` in the history and ``.env`` in
the call are different features, and each segment's count vector is L2-normalised on its
own, so a long history does not dilute the call.

The hash is a 64-bit multiply-xor over the n-gram's token ids (FNV-1a's constants), fully
vectorised with NumPy; it is stable across runs and machines (no Python ``hash``), so a
checkpoint's wide weights mean the same after a restart. Bucket 0 is the wide path's
bias: every source has it with value 1 (an n-gram hashing there shares it; 1 in 2^18).

Training (docs/learning.md, "wide & deep"): the wide weights are NOT stepped by AdamW with
the transformer. `WideAdaGrad` updates them from every fresh signal as it is read, one
signal at a time, by AdaGrad per bucket -- the optimiser the wide half of Wide & Deep and
the anchor use, and what lets a linear model learn from its first signals -- with the
deep logit as a fixed offset: the gradient of the joint loss with respect to the wide
weights, exact, holding the transformer still. The transformer's step holds the wide
weights still in turn (block-coordinate descent on one loss).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Sequence

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


BIAS_BUCKET = 0


def wide_features(ids: list[int], segs: list[int], n_max: int, buckets: int,
                  history_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Sparse features of one encoded source: (bucket ids [K], values [K]).

    Segment 0 is the current call, segment 1 the history (SEP tokens included, so an
    n-gram can mark an entry's start). A bucket hit by both segments appears twice; the
    linear logit sums both terms, which is what a dense vector with that bucket's total
    would give. The history's values are scaled by `history_scale` (a linear model gives a
    session's previous calls less say than the call it judges), and the bias feature
    (bucket 0, value 1) comes first.
    """
    arr = np.asarray(ids, dtype=np.uint64)
    seg = np.asarray(segs)
    call, hist = (_segment_features(arr[seg == s], s, n_max, buckets) for s in (0, 1))
    return (np.concatenate([[BIAS_BUCKET], call[0], hist[0]]),
            np.concatenate([[1.0], call[1], history_scale * hist[1]]))


#: At most this many distinct words / history crosses per source: a hostile 64 KiB call
#: costs a bounded amount of hashing, and real calls have far fewer (~10-40 words).
MAX_STRUCTURED = 256
_WORD = re.compile(r"[A-Za-z0-9_]+|[^A-Za-z0-9_\s]")


def _parse_call(text: str) -> tuple[str, dict]:
    """(tool, arguments) of an MCP-style call ``<tool> <JSON object>``; anything else is
    (first word, {"": the rest}), so a free-form context still gets word features."""
    tool, _, raw = text.partition(" ")
    if raw.startswith("{"):
        try:
            args = json.loads(raw)
        except (ValueError, RecursionError):
            args = None
        if isinstance(args, dict):
            return tool, args
    return tool, ({"": raw} if raw else {})


def _bucket(name: str, buckets: int) -> int:
    """A stable bucket in 1..buckets-1 (never the bias's) for a structured feature name."""
    h = int.from_bytes(hashlib.blake2b(name.encode("utf-8", "surrogatepass"),
                                       digest_size=8).digest(), "little")
    return 1 + h % (buckets - 1)


def structured_features(context: str, history: Sequence[str] | None, buckets: int,
                        word_scale: float, cross_scale: float
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Features of the call's parsed arguments and of the call x its history: (idx, val).

    Why, beside the byte n-grams (measured, docs/learning.md "Structured wide features"):

    - **Argument words** ``tool|key|word`` for every word of every argument value (value
      `word_scale` / sqrt(count)): a word means something in its argument (``-rf`` in
      ``shell.exec cmd``, ``main`` in ``git.push branch``), which an n-gram across the
      JSON cannot say.
    - **History crosses** ``(tool, method) x (entry's tool, the file it touched)``: for
      each history entry with a ``path`` argument, one feature of value `cross_scale`
      naming the call's tool and HTTP method and that file's last component
      (``http.request|POST # fs.read|.env``). A linear logit is a sum, so it cannot say
      "an outbound POST AND a secret read earlier" from the two apart; the cross can.
    """
    out: list[tuple[int, float]] = []
    tool, args = _parse_call(context)
    if word_scale > 0:
        words: dict[str, None] = {}  # insertion-ordered set
        for key, value in args.items():
            text = value if isinstance(value, str) else json.dumps(value)
            for m in _WORD.finditer(text):
                if len(words) >= MAX_STRUCTURED:
                    break
                words.setdefault(f"w|{tool}|{key}|{m.group()}")
        if words:
            v = word_scale / np.sqrt(len(words))
            out += [(_bucket(w, buckets), v) for w in words]
    if cross_scale > 0 and history:
        method = args.get("method")
        key = f"x|{tool}|{method if isinstance(method, str) else ''}#"
        crosses: dict[str, None] = {}
        for entry in history[-MAX_STRUCTURED:]:
            e_tool, e_args = _parse_call(entry)
            path = e_args.get("path")
            if isinstance(path, str) and path:
                crosses.setdefault(key + e_tool + "|" + posixpath.basename(path.rstrip("/")))
        out += [(_bucket(c, buckets), cross_scale) for c in crosses]  # <= MAX_STRUCTURED
    if not out:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    return (np.fromiter((i for i, _ in out), np.int64, len(out)),
            np.fromiter((v for _, v in out), np.float64, len(out)))


class WideAdaGrad:
    """Online AdaGrad on the wide path's weights, one signal at a time.

    For a signal with sparse features (idx, val), the rest of the gate's logit `z_rest`
    (the transformer's, held fixed), label y and weight w_i:

        z = z_rest + scale * sum_k val_k W[idx_k]
        dL/dW[j] = w_i (sigmoid(z) - y) * scale * sum_{k: idx_k = j} val_k  (+ l2 W[j])
        G[j] += g_j^2;   W[j] -= lr g_j / (sqrt(G[j]) + eps)

    `weights` and `accum` are views (the wide slice of the model's flat buffer and of
    AdamW's `v`, which AdamW leaves alone), so a checkpoint carries both.
    """

    def __init__(self, weights, accum, *, scale: float, lr: float = 0.5, l2: float = 1e-5,
                 eps: float = 1e-8, xp=np) -> None:
        self.w, self.g2, self.scale, self.xp = weights, accum, scale, xp
        self.lr, self.l2, self.eps = lr, l2, eps

    def gradient(self, idx: np.ndarray, val: np.ndarray, z_rest: float, label: float,
                 weight: float) -> tuple[np.ndarray, np.ndarray, float]:
        """(unique buckets, dL/dW at them, logit z) of one signal's weighted BCE
        L = weight * (max(z, 0) - z y + log(1 + exp(-|z|))) (+ l2/2 ||W_touched||^2)."""
        idx, g, z, _, _ = self._gradient(idx, val, z_rest, label, weight)
        return idx, g, z

    def learn(self, idx: np.ndarray, val: np.ndarray, z_rest: float, label: float,
              weight: float) -> float:
        """One AdaGrad update from one signal; returns its logit before the update."""
        _, g, z, d_idx, w_now = self._gradient(idx, val, z_rest, label, weight)
        g2 = self._host(self.g2[d_idx]).astype(np.float64) + g * g
        self.g2[d_idx] = self.xp.asarray(g2, dtype=self.g2.dtype)
        self.w[d_idx] = self.xp.asarray(w_now - self.lr * g / (np.sqrt(g2) + self.eps),
                                        dtype=self.w.dtype)
        return z

    def _gradient(self, idx, val, z_rest, label, weight):
        """`gradient`, plus the buckets on the backend and their weights (host, float64),
        so an update reads each touched weight once."""
        keep = val != 0
        idx, inv = np.unique(np.asarray(idx)[keep], return_inverse=True)
        val = np.bincount(inv, weights=np.asarray(val, np.float64)[keep])  # one entry a bucket
        d_idx = self.xp.asarray(idx)
        w_now = self._host(self.w[d_idx]).astype(np.float64)
        z = z_rest + self.scale * float(w_now @ val)
        dz = weight * (0.5 * (1.0 + np.tanh(0.5 * z)) - label)
        return idx, self.scale * dz * val + self.l2 * w_now, z, d_idx, w_now

    @staticmethod
    def _host(a) -> np.ndarray:
        return a.get() if hasattr(a, "get") else np.asarray(a)

    def relax(self, factor: float) -> None:
        """Scale the squared-gradient sums by `factor` (0 = forget them): after a policy
        change AdaGrad's steps have shrunk with everything it has seen; relaxing them
        lets the wide path move as fast as at the start."""
        self.g2 *= factor


def pad_features(feats: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of sparse features as dense [B, K] (bucket 0, value 0 where padded: adds 0)."""
    k = max(1, max((f[0].shape[0] for f in feats), default=0))
    idx = np.zeros((len(feats), k), dtype=np.int64)
    val = np.zeros((len(feats), k), dtype=np.float64)
    for i, (fi, fv) in enumerate(feats):
        idx[i, : fi.shape[0]] = fi
        val[i, : fv.shape[0]] = fv
    return idx, val
