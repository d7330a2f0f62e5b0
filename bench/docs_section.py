"""Write one benchmark's section of docs/benchmarks.md, leaving the others alone."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = ("# Benchmarks\n\nMeasured results of the benchmarks in `bench/`. Each section "
          "is (re)written by the benchmark named in it.\n")


def write_section(heading: str, text: str, path: Path = DOC) -> None:
    """Replace the section that starts with the line `heading` (up to the next `## `),
    or append it; `text` is the whole section, heading included."""
    old = path.read_text() if path.exists() else HEADER
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL)
    if pattern.search(old):
        new = pattern.sub(lambda _m: text.rstrip("\n") + "\n\n", old, count=1)
    else:
        new = old.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new.rstrip("\n") + "\n")


def section_suffix_error(title: str, section: str | None) -> str | None:
    """Why `section` cannot be a benchmark's `--section` (the suffix it appends to its
    heading, "## <title> (<what ran>, <section>)"), or None when it can. Why: a whole
    heading passed as the suffix gave "## Live daemon (flint, CPU, Live daemon (...))" in
    benchmarks.md; said before a run of twenty minutes, not found after it."""
    if section and (section.lstrip().startswith("#") or section.startswith(f"{title} (")):
        return (f"--section is the end of the heading '## {title} (...', not a heading: give "
                f"only what follows (e.g. 'main abc1234, seed 3'), not {section[:50]!r}")
    return None


def cpu_name(default: str | None = None) -> str:
    """The CPU's model name (/proc/cpuinfo), else `default` (platform.processor() or the
    architecture when None), for the machine line of a benchmark section."""
    cpu = platform.processor() or (platform.machine() if default is None else default)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return cpu


def machine() -> str:
    """"<cpu>, <n> cores, Python <version>"."""
    return f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}"


#: the speed probe's float32 product (m, k, n): (256 source positions x d_model 256) by
#: (d_model x d_ff 1024), flint's first feed-forward product over one long source
_PROBE_SHAPE = (256, 256, 1024)
_PROBE_CODE = """
import time, numpy as np
m, k, n = {shape}
a = np.random.default_rng(0).standard_normal((m, k), dtype=np.float32)
b = np.random.default_rng(1).standard_normal((k, n), dtype=np.float32)
def best(f, reps):
    out = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            f()
        out.append((time.perf_counter() - t) / reps)
    return min(out)
a @ b
gemm = best(lambda: a @ b, 20)
def py():
    d, s = {{}}, 0
    for i in range(20000):
        d[i & 255] = s
        s += i % 7
best(py, 1)
print(2 * m * k * n / gemm / 1e9, 20000 / best(py, 3) / 1e6)
"""


def speed_probe(threads: tuple[int, ...] | None = None) -> str:
    """One line saying how fast this machine is at what the trainer does, for reading step
    counts across machines: the best of five timings of a float32 matrix product of
    flint's feed-forward shape (`_PROBE_SHAPE`) in GFLOP/s, with BLAS at 1 thread and at
    every usable core, and a small dict-and-integer Python loop in million iterations/s.

    Why: the trainer's steps in a fixed stretch of signals (bench_learning's virtual clock
    bills real time; bench_live is real time) halved between VMs with the same CPU name
    and the same code (docs/learning.md "The same code at half the steps"), and a table's
    machine line could not tell a slow VM from a slow change. Each count is measured in
    a fresh interpreter (the BLAS thread count is read when NumPy loads), ~1 s each."""
    cores = len(os.sched_getaffinity(0))
    threads = threads or tuple(sorted({1, cores}))
    gflops, python = [], []
    for t in threads:
        env = {**os.environ, **{v: str(t) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                      "MKL_NUM_THREADS")}}
        try:
            out = subprocess.run([sys.executable, "-c", _PROBE_CODE.format(shape=_PROBE_SHAPE)],
                                 env=env, capture_output=True, text=True, timeout=120,
                                 check=True).stdout.split()
            gflops.append(f"{float(out[0]):.0f} GFLOP/s at {t} thread{'s' if t > 1 else ''}")
            python.append(float(out[1]))
        except (subprocess.SubprocessError, OSError, ValueError, IndexError) as e:
            return f"speed probe failed ({type(e).__name__}: {e}); step counts not comparable"
    m, k, n = _PROBE_SHAPE
    return (f"speed probe: float32 {m}x{k} @ {k}x{n} {', '.join(gflops)}; "
            f"a Python dict loop {max(python):.1f} M iterations/s")
