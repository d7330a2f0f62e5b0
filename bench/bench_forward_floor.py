"""The arithmetic floor of one serving forward on this CPU (issue 12, acceptance 1).

A `predict` runs the encoder over the call (64-byte context: 64 tokens), pools, and adds
the wide path. Its matrix products are fixed by the model: per encoder layer QKV
(T x d x 3d), the output projection (T x d x d), the two feed-forward GEMMs
(T x d x d_ff, T x d_ff x d) and attention's two T x T x d products. This script times
exactly those GEMMs back to back (float32, the best of `--repeat`) and the whole serving
forward (`Snapshot.logits` of one source, the InferencePlan the daemon serves with), with
OpenBLAS limited to 1 and to 2 threads, and prints what each costs. No socket, no
daemon: this is the part no amount of daemon engineering can remove.

    .venv/bin/python bench/bench_forward_floor.py                  # flint
    .venv/bin/python bench/bench_forward_floor.py --preset tiny --no-docs
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from docs_section import machine, write_section  # noqa: E402

from gated.daemon.serving import Snapshot  # noqa: E402
from gated.engine import ModelConfig, source_batch  # noqa: E402
from gated.engine.layout import num_params, param_layout  # noqa: E402

SECTION = "## Serving forward: the arithmetic floor (CPU)"


def gemm_shapes(cfg: ModelConfig, tokens: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of one encoder layer's products for a source of `tokens` tokens."""
    t, d, ff = tokens, cfg.d_model, cfg.d_ff
    return [(t, d, 3 * d), (t, d, d), (t, d, ff), (t, ff, d), (t, d, t), (t, t, d)]


def best_seconds(fn, repeat: int) -> tuple[float, float]:
    """(best, median) wall seconds of `fn()` over `repeat` calls, after one warm-up."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), float(np.median(times))


def measure(preset: str, repeat: int) -> dict:
    cfg = ModelConfig.preset(preset)
    context = "shell.exec " + "x" * 53  # 64 bytes, as bench_predict.py sends
    sources = source_batch([(context, None)], cfg)
    tokens = int(sources["src"].shape[1])
    shapes = gemm_shapes(cfg, tokens)
    flops = cfg.n_enc_layers * sum(2 * m * k * n for m, k, n in shapes)
    rng = np.random.default_rng(0)
    mats = [(rng.standard_normal((m, k), dtype=np.float32),
             rng.standard_normal((k, n), dtype=np.float32)) for m, k, n in shapes]

    def gemms() -> None:
        for _ in range(cfg.n_enc_layers):
            for a, b in mats:
                a @ b

    flat = (rng.standard_normal(num_params(param_layout(cfg))) * 0.02).astype(np.float32)
    snap = Snapshot.of(cfg, flat, 1, 1, "numpy")
    rows = []
    for threads in (1, 2):
        with threadpool_limits(threads):
            g_best, _ = best_seconds(gemms, repeat)
            f_best, f_med = best_seconds(lambda: snap.logits(sources), repeat)
        rows.append({"threads": threads, "gemm_ms": g_best * 1e3,
                     "gflops": flops / g_best / 1e9, "fwd_best_ms": f_best * 1e3,
                     "fwd_p50_ms": f_med * 1e3})
    return {"preset": preset, "tokens": tokens, "gflop": flops / 1e9, "rows": rows}


def render(r: dict, command: str) -> str:
    lines = [
        SECTION, "",
        f"Command: `.venv/bin/python {command}`", "",
        f"Machine: {machine()}. Preset {r['preset']}, one 64-byte context ({r['tokens']} "
        f"tokens): the encoder's matrix products are {r['gflop']:.3f} GFLOP per predict.", "",
        "| OpenBLAS threads | those GEMMs alone, best | rate | whole serving forward, best "
        "| whole serving forward, p50 |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in r["rows"]:
        lines.append(f"| {row['threads']} | {row['gemm_ms']:.2f} ms | {row['gflops']:.0f} "
                     f"GFLOPS | {row['fwd_best_ms']:.2f} ms | {row['fwd_p50_ms']:.2f} ms |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="flint", choices=("tiny", "flint"))
    ap.add_argument("--repeat", type=int, default=300)
    ap.add_argument("--no-docs", action="store_true")
    a = ap.parse_args()
    command = "bench/bench_forward_floor.py " + " ".join(sys.argv[1:])
    text = render(measure(a.preset, a.repeat), command.strip())
    print(text)
    if not a.no_docs:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
