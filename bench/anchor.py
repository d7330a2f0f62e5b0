"""The anchor: online logistic regression on hashed character n-grams.

The learning benchmark needs a reference that is cheap, honest and hard to beat by
accident: a linear model over every byte 1..4-gram of what the gate sees (the history
entries, then the call, joined with " | ": `anchor_text`), learning from the same labels
as the daemon (the gate's decisions; corrections as weight-4 examples), one pass,
predict-then-learn. If gated cannot beat this, its depth is not paying for itself.

Features: n-grams of the UTF-8 bytes, hashed by a vectorised polynomial hash (FNV prime,
uint64 wrap-around, a multiply-xorshift finaliser; stable across runs and machines) into
`2**bits` buckets, as L2-normalised term counts. The call and the history are hashed
into separate namespaces and normalised apart (the history block scaled by
`history_scale`): with one bag over the whole text, ~4 history entries outweigh the
call they precede and the model falls to ~0.85, about the "always allow" rate (row
"one bag" below). The split is read off the text itself (`split_source`). AdaGrad per
bucket; L2 applied lazily to the buckets a step touches.

Sweep (`python bench/anchor.py`): GatewayTraffic seeds 0-2, 6,000 signals, policy
v1 -> v2 at 3,000; labels from the noisy gate plus corrections; scored progressively
against the TRUE label on ordinary signals. pre = last 1,000 before the change,
post = last 1,000 of the stream, mean of the three seeds (seed spread ~0.02):

    AdaGrad lr      0.1    0.2    0.3    0.5    1.0    2.0     (history_scale 0.25)
      pre         0.916  0.943  0.950  0.954  0.952  0.946
      post        0.953  0.975  0.979  0.984  0.986  0.981
    SGD lr 0.3 / 1.0 / 3.0: pre 0.869 / 0.875 / 0.855, post 0.909 / 0.928 / 0.920
    lr 0.5: history_scale 0 / 0.25 / 0.5: pre 0.954 / 0.954 / 0.949 (history barely
    helps a linear model: rule 12 is a conjunction); l2 0 / 1e-5 / 1e-4: pre 0.954 all
    one bag (no call/history split), lr 0.5: pre 0.852, post 0.758

Defaults: AdaGrad, lr 0.5, l2 1e-5, history_scale 0.25, 2**20 buckets, n = 1..4.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout
from gated.traffic import GatewayTraffic  # noqa: E402

SEP = " | "
_CALL_START = re.compile(r" \| (?=[\w-]+(\.[\w-]+)* \{)")  # " | " that opens an MCP call
_PRIME = np.uint64(0x100000001B3)  # FNV-1a 64-bit prime
_MIX = np.uint64(0x9E3779B97F4A7C15)  # golden-ratio multiplier of the finaliser
_M64 = (1 << 64) - 1


def anchor_text(context: str, history: Sequence[str] | None) -> str:
    """The source as the gate sees it: history entries (oldest first), then the call."""
    return SEP.join([*(history or []), context])


def split_source(text: str) -> tuple[str, str]:
    """(history part, call part) of an `anchor_text`: the call starts after the last " | "
    that is followed by an MCP tool name and "{" (a shell pipe inside a call is not)."""
    starts = [m.end() for m in _CALL_START.finditer(text)]
    return (text[: starts[-1] - len(SEP)], text[starts[-1]:]) if starts else ("", text)


def ngram_buckets(data: bytes, n_max: int = 4, bits: int = 20, salt: int = 0) -> np.ndarray:
    """Bucket ids of every 1..`n_max`-gram of `data` (uint64), by a rolling polynomial hash:
    h_n[i] = h_{n-1}[i] * P + b[i+n-1] + 1, so each length costs one vector op."""
    b = np.frombuffer(data, dtype=np.uint8).astype(np.uint64)
    h = np.zeros(len(b), dtype=np.uint64)
    out = []
    for n in range(1, n_max + 1):
        if len(b) < n:
            break
        h = h[: len(b) - n + 1] * _PRIME + b[n - 1:] + np.uint64(1)
        x = (h ^ np.uint64((n * 0xC2B2AE3D27D4EB4F + salt * 0x165667B19E3779F9) & _M64)) * _MIX
        x ^= x >> np.uint64(31)
        out.append((x * _MIX) >> np.uint64(64 - bits))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.uint64)


class HashedNgramLR:
    """Online logistic regression, p = P(allow), on L2-normalised hashed n-gram counts."""

    def __init__(self, lr: float = 0.5, l2: float = 1e-5, *, bits: int = 20, n_max: int = 4,
                 optimizer: str = "adagrad", history_scale: float = 0.25,
                 split: bool = True) -> None:
        if optimizer not in ("adagrad", "sgd"):
            raise ValueError(f"optimizer is 'adagrad' or 'sgd', got {optimizer!r}")
        self.lr, self.l2, self.bits, self.n_max, self.optimizer = lr, l2, bits, n_max, optimizer
        self.history_scale, self.split = history_scale, split
        self.w = np.zeros(1 << bits)
        self.g2 = np.zeros(1 << bits)  # AdaGrad's per-bucket sum of squared gradients
        self.b, self.bg2 = 0.0, 0.0
        self._cache: tuple[str, np.ndarray, np.ndarray] | None = None

    def _features(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        # predict-then-learn on the same text is the common case: hash it once
        if self._cache is not None and self._cache[0] == text:
            return self._cache[1], self._cache[2]
        parts = split_source(text) if self.split else ("", text)
        idxs, vals = [], []
        for salt, (part, scale) in enumerate(zip(parts, (self.history_scale, 1.0), strict=True)):
            ids = ngram_buckets(part.encode("utf-8"), self.n_max, self.bits, salt).astype(np.intp)
            idx, counts = np.unique(ids, return_counts=True)
            if counts.size:
                idxs.append(idx)
                vals.append(scale * counts / np.sqrt(float(np.dot(counts, counts))))
        idx = np.concatenate(idxs) if idxs else np.zeros(0, dtype=np.intp)
        val = np.concatenate(vals) if vals else np.zeros(0)
        # the rare bucket shared by call and history: add up so the indices are unique
        if len(np.unique(idx)) != len(idx):
            idx, inv = np.unique(idx, return_inverse=True)
            val = np.bincount(inv, weights=val)
        self._cache = (text, idx, val)
        return idx, val

    def _z(self, idx: np.ndarray, val: np.ndarray) -> float:
        return float(np.dot(self.w[idx], val)) + self.b

    def predict_proba(self, text: str) -> float:
        """P(allow) of a source text (`anchor_text`)."""
        idx, val = self._features(text)
        return float(1.0 / (1.0 + np.exp(-np.clip(self._z(idx, val), -35.0, 35.0))))

    def learn(self, text: str, y: float, weight: float = 1.0) -> None:
        """One weighted log-loss step towards label `y` (1.0 = allow)."""
        idx, val = self._features(text)
        g = weight * (self.predict_proba(text) - y)
        grad = g * val + self.l2 * self.w[idx]
        if self.optimizer == "adagrad":
            self.g2[idx] += grad * grad
            self.w[idx] -= self.lr * grad / (np.sqrt(self.g2[idx]) + 1e-8)
            self.bg2 += g * g
            self.b -= self.lr * g / (np.sqrt(self.bg2) + 1e-8)
        else:
            self.w[idx] -= self.lr * grad
            self.b -= self.lr * g


def label_weight(signal: dict) -> tuple[float, float]:
    """Label and weight as the daemon derives them (DESIGN.md section 2; a correction's
    first occurrence weighs 4)."""
    fb = signal.get("feedback")
    if fb in ("false_positive", "override_allow"):
        return 1.0, 4.0 if fb == "false_positive" else 2.0
    if fb in ("false_negative", "override_block"):
        return 0.0, 4.0 if fb == "false_negative" else 2.0
    return (1.0 if signal["decision"] == "allow" else 0.0), 1.0


def progressive(model: HashedNgramLR, n_signals: int = 6000, switch_at: int = 3000,
                seed: int = 0) -> list[tuple[int, bool, str]]:
    """Run `model` on a GatewayTraffic stream (policy v2 from signal `switch_at` on),
    predicting each signal before learning from its label, and return, per ordinary
    signal, (stream index, prediction agrees with the TRUE label, policy)."""
    traffic = GatewayTraffic(seed=seed)
    out = []
    for i in range(n_signals):
        if i == switch_at:
            traffic.policy = "v2"
        ev = traffic.next()
        text = anchor_text(ev.signal["context"], ev.signal.get("history"))
        if not ev.is_correction:
            out.append((i, (model.predict_proba(text) >= 0.5) == ev.true_allow, ev.policy))
        model.learn(text, *label_weight(ev.signal))
    return out


def tune(settings: Iterable[dict], n_signals: int = 6000, switch_at: int = 3000,
         seed: int = 0) -> list[dict]:
    """Progressive alignment vs TRUE for each constructor-kwargs dict in `settings`:
    "pre" over the last 1,000 ordinary signals before the change, "post" over the last
    1,000 of the stream."""
    rows = []
    for kw in settings:
        res = progressive(HashedNgramLR(**kw), n_signals, switch_at, seed)
        pre = [c for i, c, _ in res if i < switch_at][-1000:]
        rows.append({**kw, "pre": float(np.mean(pre)),
                     "post": float(np.mean([c for _, c, _ in res[-1000:]]))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lr", type=float, nargs="*", default=[0.1, 0.2, 0.3, 0.5, 1.0, 2.0])
    ap.add_argument("--optimizer", default="adagrad", choices=["adagrad", "sgd"])
    ap.add_argument("--l2", type=float, default=1e-5)
    ap.add_argument("--history-scale", type=float, default=0.25)
    ap.add_argument("--signals", type=int, default=6000)
    ap.add_argument("--switch-at", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    grid = [{"lr": lr, "l2": a.l2, "optimizer": a.optimizer, "history_scale": a.history_scale}
            for lr in a.lr]
    for r in tune(grid, a.signals, a.switch_at, a.seed):
        print(f"{r['optimizer']:8s} lr {r['lr']:<6g} l2 {r['l2']:<6g} pre {r['pre']:.3f} "
              f"post {r['post']:.3f}", flush=True)


if __name__ == "__main__":
    main()
