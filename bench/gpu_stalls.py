"""Where a GPU trainer's slow `train_on` calls spend their time: the learning benchmark's run
with every `train_on` timed, the main thread's stack sampled, and every CuPy kernel
compile (or load from its disk cache) logged with the trainer frame that asked for it.

Why (docs/learning.md, "On an H200 with today's code" and "The first seconds on a GPU"):
after the rehearsal, the first GPU runs still stalled 3-8 s in their first few steps
(seed 3: three `train_on` calls of 4.9, 5.6 and 2.7 s around signals 7-220), and every
signal that arrived meanwhile was scored by a snapshot that had learned from a handful;
seed 3's first 500-signal checkpoint was lost to the anchor that way. This says which code
the stalls are in, so that the rehearsal (gated/daemon/trainer/rehearsal.py) can cover it.

    python3 bench/gpu_stalls.py --seed 3 --signals 400 --out $OUT/stalls-seed3.json

Run it twice in fresh processes on one machine with one `CUPY_CACHE_DIR`: if the stalls are
compiles, the second run (its kernels on disk) does not have them.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_learning  # noqa: E402
import numpy as np  # noqa: E402

from gated.daemon.trainer.loop import Trainer  # noqa: E402

T0 = time.perf_counter()
MAIN = threading.main_thread().ident


def _now() -> float:
    return time.perf_counter() - T0


def _frames(stack: list[traceback.FrameSummary], keep: int = 6) -> list[str]:
    """The innermost `keep` frames of the project (gated/, bench/), then CuPy's innermost."""
    ours = [f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno} {f.name}"
            for f in stack if "/gated/" in f.filename or "/bench/" in f.filename]
    theirs = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in stack
              if "cupy" in f.filename]
    return ours[-keep:] + theirs[-2:]


class Sampler(threading.Thread):
    """The main thread's stack every `every` seconds, with the time it was taken."""

    def __init__(self, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.every, self.samples, self.stop = every, [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            frame = sys._current_frames().get(MAIN)
            if frame is not None:
                self.samples.append((_now(), _frames(traceback.extract_stack(frame))))
            time.sleep(self.every)


def log_compiles(events: list[dict]) -> None:
    """Time CuPy's module builds (`_compile_module_with_cache`: a compile, or a load from
    the disk cache, which takes milliseconds), each with who asked."""
    from cupy.cuda import compiler

    def timed(fn):
        def wrapper(*args, **kwargs):
            t = _now()
            try:
                return fn(*args, **kwargs)
            finally:
                source = args[0] if args and isinstance(args[0], str) else ""
                head = next((ln for ln in source.splitlines()
                             if "__global__" in ln or "extern" in ln), source[:80])
                events.append({"at": round(t, 3),
                               "seconds": round(_now() - t, 3), "kernel": head.strip()[:160],
                               "from": _frames(traceback.extract_stack()[:-1])})
        return wrapper

    compiler._compile_module_with_cache = timed(compiler._compile_module_with_cache)


def time_train_on(calls: list[dict]) -> None:
    original = Trainer.train_on

    def train_on(self, fresh, turns=False):
        t = _now()
        try:
            return original(self, fresh, turns=turns)
        finally:
            calls.append({"at": round(t, 3), "seconds": round(_now() - t, 3),
                          "fresh": len(fresh), "step": self.status.step})
    Trainer.train_on = train_on


def mark_rehearsal_end(marks: dict) -> None:
    """Record when the start-up rehearsal ends: what compiles after it, the stream pays."""
    from gated.daemon.trainer import rehearsal

    original = rehearsal.rehearse

    def rehearse(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:
            marks["rehearsed"] = _now()
    rehearsal.rehearse = rehearse


def reduction_census() -> None:
    """The first and second call of a whole-array reduction (and of the scatter-add that
    replaced bincount) at growing sizes, in this process's CuPy setup: a first call that
    is seconds slower than the second is a compile."""
    import cupy

    from gated.engine import ops_cupy

    chosen = os.environ.get("CUPY_ACCELERATORS", "unset")
    print(f"reduction accelerators: {ops_cupy.REDUCTION_ACCELERATORS} "
          f"(CUPY_ACCELERATORS {chosen!r})")
    ops = {"sum f64": lambda x: x.sum(dtype=np.float64), "any": lambda x: (x < 0).any(),
           "max": lambda x: x.max(), "all finite": lambda x: cupy.isfinite(x).all(),
           "add.at": lambda x: cupy.add.at(cupy.zeros(x.size, dtype=np.float64),
                                           cupy.arange(x.size), x.astype(np.float64))}
    for name, op in ops.items():
        cells = []
        for n in (7, 500, 30000, 2000000):
            x = cupy.random.random(n, dtype=np.float32)
            times = []
            for _ in range(2):
                t = time.perf_counter()
                op(x)
                cupy.cuda.get_current_stream().synchronize()
                times.append(time.perf_counter() - t)
            cells.append(f"{n}: {times[0] * 1e3:.0f}/{times[1] * 1e3:.1f}")
        print(f"  {name:12s} first/second ms: " + ", ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--signals", type=int, default=400)
    ap.add_argument("--slow", type=float, default=0.5, help="a train_on this long is a stall")
    ap.add_argument("--out", default=None, help="the report (JSON; the trace beside it)")
    ap.add_argument("--reductions", action="store_true",
                    help="only the reduction census (no learning run)")
    ap.add_argument("--backend", default="cupy", choices=("cupy", "numpy"),
                    help="numpy: a dry run of this script on a CPU (no compiles to log)")
    a = ap.parse_args()
    if a.reductions:
        reduction_census()
        return
    if a.out is None:
        ap.error("--out is needed for a learning run (only --reductions goes without)")
    compiles, calls, marks = [], [], {}
    mark_rehearsal_end(marks)
    if a.backend == "cupy":
        log_compiles(compiles)
    time_train_on(calls)
    sampler = Sampler()
    sampler.start()
    t_run = _now()
    r = bench_learning.run("flint", 1e-3, 20.0, a.signals, a.signals, a.seed, probes=100,
                           backend=a.backend, trace=str(Path(a.out).with_suffix(".jsonl")))
    sampler.stop.set()
    # the stream's calls only: the rehearsal's own train_on calls (its helpings of 1 and 40
    # synthetic signals) are where compiles belong, before the clock
    after = marks.get("rehearsed", t_run)
    calls = [c for c in calls if c["at"] >= after]
    stalls = []
    for c in calls:
        if c["seconds"] < a.slow:
            continue
        lo, hi = c["at"], c["at"] + c["seconds"]
        stacks = collections.Counter(" <- ".join(reversed(s)) for t, s in sampler.samples
                                     if lo <= t <= hi)
        stalls.append({**c, "compiles": [e for e in compiles if lo <= e["at"] <= hi],
                       "stacks": stacks.most_common(8)})
    report = {"seed": a.seed, "run_started": round(t_run, 3), "calls": len(calls),
              "rehearsed_at": round(after, 3),
              "slow_calls": stalls, "compiles_total": len(compiles),
              "compiles_in_run": [e for e in compiles if e["at"] >= after],
              "first_checkpoint": r["rows"][0] if r["rows"] else None}
    Path(a.out).write_text(json.dumps(report, indent=1, default=str))
    print(f"seed {a.seed}: {len(calls)} train_on calls, {len(stalls)} of >= {a.slow} s; "
          f"{len(compiles)} module builds ({len(report['compiles_in_run'])} after the "
          f"rehearsal, {sum(e['seconds'] for e in report['compiles_in_run']):.2f} s)")
    for s in stalls:
        print(f"  train_on at {s['at']:.1f} s: {s['seconds']:.2f} s, {s['fresh']} fresh, "
              f"step {s['step']}; builds inside: {len(s['compiles'])} "
              f"({sum(e['seconds'] for e in s['compiles']):.2f} s)")
        for stack, n in s["stacks"][:3]:
            print(f"    {n:4d} x {stack[:400]}")
    for row in r["rows"]:
        print(f"  checkpoint {row['n']}: gated {row['gated']:.3f}, anchor {row['anchor']:.3f}, "
              f"{row['steps']} steps, {row['virtual_s']} virtual s")


if __name__ == "__main__":
    main()
