"""Offline ablation of the source encoding (DESIGN.md section 1, revised 2026-11-23).

Clean TRUE labels, no noise, no replay, no time budget: the model variants of
bench_learning.VARIANTS train on the first `--train` calls of the realistic stream
(gated.traffic, policy v1) for `--epochs` epochs at batch 16, then are tested on the
next `--test` calls, on calls built only from held-out values (unseen hosts, paths,
tables, ...) and on history-rule pairs (the same outbound call with and without a secret
read 1-10 calls back). The online side of the ablation is bench_learning.py --variant.

`v2-deep-call-alone` is format 2 fed the current call only (every history dropped, the
probes' too): the issue's reference for what the history costs the calls whose label does
not depend on it; its history-rule probes cannot be told apart (0.5 expected).

flint needs a GPU to train 3,500 calls for 10 epochs; `--model KEY=VALUE` shrinks the
transformer (both encodings get the same one) so that a 2-core CPU can show the
difference between the encodings in minutes:

    .venv/bin/python bench/bench_encoding.py --write
    .venv/bin/python bench/bench_encoding.py --train 3500 --test 500 --epochs 10 \
        --model d_model=64 --model d_ff=256 --model n_heads=4 --model n_enc_layers=2 \
        --model n_dec_layers=1 --variant v1-deep --variant v2-deep \
        --variant v2-deep-call-alone --write --section "a transformer small enough for 2 cores"
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_learning import VARIANTS, field_overrides  # noqa: E402
from docs_section import section_suffix_error  # noqa: E402

from gated.engine import AdamW, Model, ModelConfig, build_batch, source_batch, train_step  # noqa: E402
from gated.traffic import GatewayTraffic  # noqa: E402

#: The pseudo-variant fed the current call alone, and the config variant it runs on.
CALL_ALONE = "v2-deep-call-alone"
DEEP_VARIANTS = {**{v: VARIANTS[v] for v in VARIANTS if v.endswith("-deep")},
                 CALL_ALONE: VARIANTS["v2-deep"]}


def sources(events, with_history: bool) -> list[tuple[str, list | None]]:
    """What the model reads of each event: (call, history), or the call alone."""
    return [(e.signal["context"], e.signal.get("history") if with_history else None)
            for e in events]


def _examples(events, with_history: bool) -> list[dict]:
    return [{"context": context, "history": history or [], "reason": e.signal.get("reason"),
             "label": float(e.true_allow), "weight": 1.0}
            for (context, history), e in zip(sources(events, with_history), events,
                                             strict=True)]


def _accuracy(model: Model, events, cfg: ModelConfig, with_history: bool) -> float:
    hits = 0
    for i in range(0, len(events), 64):
        chunk = events[i: i + 64]
        p = model.predict_proba(source_batch(sources(chunk, with_history), cfg))
        hits += sum((pi >= 0.5) == e.true_allow for pi, e in zip(p, chunk, strict=True))
    return hits / len(events)


def model_overrides(pairs: list[str]) -> dict:
    """`--model KEY=VALUE` pairs as ModelConfig overrides, each value of its field's type."""
    return field_overrides(ModelConfig, pairs, "--model")


def run(preset: str, variant: str, n_train: int, n_test: int, epochs: int, lr: float,
        seed: int, overrides: dict | None = None) -> list[dict]:
    cfg = dataclasses.replace(ModelConfig.preset(preset), **DEEP_VARIANTS[variant],
                              **(overrides or {}))
    with_history = variant != CALL_ALONE
    traffic = GatewayTraffic(seed=seed)
    stream = []
    while len(stream) < n_train + n_test:
        ev = traffic.next()
        if not ev.is_correction:
            stream.append(ev)
    train, test = stream[:n_train], stream[n_train:]
    unseen = traffic.probes(300, seed + 1)
    hist = traffic.history_probes(300, seed + 2)
    model = Model.init(cfg, seed=seed)
    opt = AdamW.for_model(model, lr=lr)
    rng = np.random.default_rng(seed)
    rows = []
    examples = _examples(train, with_history)
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        order = rng.permutation(len(examples)) if epoch > 1 else np.arange(len(examples))
        for i in range(0, len(order), 16):
            train_step(model, opt, build_batch([examples[j] for j in order[i: i + 16]], cfg))
        rows.append({"variant": variant, "epoch": epoch,
                     "train_s": round(time.perf_counter() - t0, 1),
                     "train": _accuracy(model, train, cfg, with_history),
                     "test": _accuracy(model, test, cfg, with_history),
                     "unseen": _accuracy(model, unseen, cfg, with_history),
                     "history": _accuracy(model, hist, cfg, with_history)})
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="flint")
    ap.add_argument("--variant", action="append", choices=sorted(DEEP_VARIANTS))
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--test", type=int, default=500)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", action="append", default=[], metavar="KEY=VALUE",
                    help="override a ModelConfig field for every variant, e.g. d_model=64")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--section", default="",
                    help="write under '## Source encoding ablation (offline, SECTION)'")
    a = ap.parse_args()
    if (bad := section_suffix_error("Source encoding ablation", a.section)) is not None:
        ap.error(bad)
    overrides = model_overrides(a.model)
    # The wide path learns online by its own AdaGrad (docs/design.md), so the offline
    # ablation compares the encodings through the transformer alone.
    variants = a.variant or ["v1-deep", "v2-deep"]
    shape = "".join(f", {k}={v}" for k, v in overrides.items())
    lines = [f"Machine: {platform.machine()}, {len(os.sched_getaffinity(0))} cores, numpy "
             f"{np.__version__}. {a.preset}{shape}, lr {a.lr:g}, batch 16, {a.train} training "
             f"calls (TRUE labels, seed {a.seed}), tested on the next {a.test}, on 300 "
             "unseen-value probes and on 300 history-rule probes.", "",
             "| variant | epoch | train | test | unseen values | history rule | train s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for v in variants:
        for r in run(a.preset, v, a.train, a.test, a.epochs, a.lr, a.seed, overrides):
            lines.append(f"| {r['variant']} | {r['epoch']} | {r['train']:.3f} | "
                         f"{r['test']:.3f} | {r['unseen']:.3f} | {r['history']:.3f} | "
                         f"{r['train_s']} |")
    print("\n".join(lines))
    if a.write:
        from docs_section import write_section

        heading = "## Source encoding ablation (offline" + (
            f", {a.section})" if a.section else ")")
        cmd = " ".join(["`.venv/bin/python", "bench/bench_encoding.py", *sys.argv[1:]]) + "`"
        write_section(heading, f"{heading}\n\nCommand: {cmd}\n\n"
                      "v1-deep: the encoding before 2026-11-23 (history first, the last bytes "
                      "kept, one pool), transformer only; v2-deep: format 2 (the call first "
                      "and whole, history newest-first abbreviated, segment embedding, two "
                      "pools), transformer only; v2-deep-call-alone: v2-deep fed the "
                      "current call only. The wide path is measured online (learning "
                      "section).\n\n"
                      + "\n".join(lines))


if __name__ == "__main__":
    main()
