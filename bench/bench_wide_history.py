"""Can the wide (linear) path learn the history rule with more history features?

Issue 10 wants the history rule (an outbound POST or external e-mail after the session
read a project secret 1-10 calls back) >= 0.90 on the benchmark's paired probes. The
wide path's features are hashed byte n-grams of the call and of the abbreviated history
(engine/wide.py). This script replays the realistic stream (gated.traffic, seed 0,
4,000 signals, labels as the daemon derives them) through a wide-only AdaGrad learner
(WideAdaGrad, lr 0.5, the transformer's logit held at 0) with extra features:

- ``hw``: a binary bag of the words of the history entries (tool names dropped), each
  with value `hw`;
- ``cs``: crosses (the call's first `ck` words, joined) x (each history word), value `cs`.

and prints progressive alignment per 500 signals vs the TRUE label, the unseen-value
probes, and the history-rule pairs: accuracy, how often the pair is ORDERED right (the
allow twin scored above the block one), and the mean logit of each side.

    .venv/bin/python bench/bench_wide_history.py

Measured (2-core EPYC VM, 2026-11-23; docs/learning.md): no variant lifts the rule above
0.55; the pairs are ordered right 82-97% of the time but both sides stay below 0.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
from anchor import label_weight  # noqa: E402

from gated.engine.config import ModelConfig  # noqa: E402
from gated.engine.tokenizer import SEP, encode_source  # noqa: E402
from gated.engine.wide import wide_features  # noqa: E402
from gated.engine.wide_learner import WideAdaGrad  # noqa: E402
from gated.traffic import GatewayTraffic  # noqa: E402

CFG = ModelConfig.preset("flint")
BUCKETS = CFG.wide_buckets
_WORD = re.compile(rb"[A-Za-z0-9_.@-]+")
_M64 = (1 << 64) - 1


def _bucket(word: bytes, salt: int) -> int:
    h = 0xCBF29CE484222325 ^ salt
    for c in word:
        h = ((h ^ c) * 0x100000001B3) & _M64
    return (((h * 0x9E3779B97F4A7C15) & _M64) >> 29) % BUCKETS


def _split(ids: list[int], segs: list[int]) -> tuple[bytes, list[bytes]]:
    """(the call's bytes, each history entry's bytes) of an encoded source."""
    call = bytes(t for t, s in zip(ids, segs, strict=True) if s == 0 and t < 256)
    entries, cur = [], bytearray()
    for t, s in zip(ids, segs, strict=True):
        if s != 1:
            continue
        if t == SEP:
            if cur:
                entries.append(bytes(cur))
            cur = bytearray()
        elif t < 256:
            cur.append(t)
    if cur:
        entries.append(bytes(cur))
    return call, entries


def features(ctx: str, hist: list[str] | None, hw: float, cs: float, ck: int):
    ids, segs = encode_source(ctx, hist, CFG)
    idx, val = wide_features(ids, segs, CFG.wide_ngram, BUCKETS, CFG.wide_history_scale,
                             CFG.wide_bias)
    call, entries = _split(ids, segs)
    words = {w for e in entries for w in _WORD.findall(e)[1:]}
    extra = [(_bucket(w, 101), hw) for w in words] if hw else []
    if cs:
        key = b" ".join(_WORD.findall(call)[:ck])
        extra += [(_bucket(key + b"|" + w, 202), cs) for w in words]
    if extra:
        idx = np.concatenate([idx, [i for i, _ in extra]])
        val = np.concatenate([val, [v for _, v in extra]])
    return idx, val


def run(hw: float, cs: float, ck: int, n: int = 4000, seed: int = 0) -> str:
    opt = WideAdaGrad(np.zeros(BUCKETS), np.zeros(BUCKETS), scale=1.0, lr=0.5, l2=1e-5)
    stream, probes = GatewayTraffic(seed=seed), GatewayTraffic(seed=seed)
    right = []
    for _ in range(n):
        ev = stream.next()
        s = ev.signal
        z = opt.learn(*features(s["context"], s.get("history"), hw, cs, ck), 0.0,
                      *label_weight(s))
        if not ev.is_correction:
            right.append((z >= 0) == ev.true_allow)

    def logits(events) -> tuple[np.ndarray, np.ndarray]:
        z = np.array([opt.gradient(*features(e.signal["context"], e.signal.get("history"),
                                             hw, cs, ck), 0.0, 1.0, 1.0)[2] for e in events])
        return z, np.array([e.true_allow for e in events])

    zu, yu = logits(probes.probes(200, 1000))
    zh, yh = logits(probes.history_probes(200, 1001))
    pairs = zh.reshape(-1, 2)  # (block member, allow twin)
    checks = " ".join(f"{np.mean(right[j - 500:j]):.3f}" for j in range(500, len(right) + 1, 500))
    return (f"| {hw:g} | {cs:g} | {ck} | {checks} | {np.mean((zu >= 0) == yu):.3f} | "
            f"{np.mean((zh >= 0) == yh):.3f} | {np.mean(pairs[:, 1] > pairs[:, 0]):.2f} | "
            f"{pairs[:, 0].mean():.2f} / {pairs[:, 1].mean():.2f} |")


def main() -> None:
    print("| hw | cs | ck | alignment per 500 | unseen probes | history rule | pairs ordered "
          "| mean z block / allow twin |")
    print("| ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |")
    for hw, cs, ck in [(0, 0, 0), (0.1, 0, 0), (0.3, 0, 0), (0, 0.1, 2), (0, 0.3, 2),
                       (0, 0.3, 1), (0.1, 0.3, 3)]:
        print(run(hw, cs, ck), flush=True)


if __name__ == "__main__":
    main()
