"""A CPU training step's chunks on several cores at once.

The CPU trainer steps in length-sorted chunks of a few rows (`step_chunk_rows`): GEMMs of
a few hundred rows, on which OpenBLAS's second thread gains little, and the elementwise
work (GELU, LayerNorm, softmax) that NumPy runs on one core. Giving each core a chunk of
its own, with ONE BLAS thread each, keeps every core busy for the whole step instead.
`Model.loss_parts_and_grads` hands a round of chunk jobs to `ChunkCores.run`; this module
owns the threads (the engine starts none).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

from threadpoolctl import ThreadpoolController

_T = TypeVar("_T")


class ChunkCores:
    """Runs a round of jobs at once on `width` cores: the calling thread takes the first,
    a pool of `width - 1` threads the others, with BLAS at one thread while they run (the
    process's BLAS thread count is put back after each round)."""

    def __init__(self, width: int) -> None:
        if width < 2:
            raise ValueError(f"ChunkCores needs at least 2 cores, got {width}")
        self.width = width
        self._pool = ThreadPoolExecutor(width - 1, thread_name_prefix="gated-chunk")
        self._blas = ThreadpoolController()  # a dependency (pyproject.toml)

    def run(self, jobs: Sequence[Callable[[], _T]]) -> list[_T]:
        """The jobs' results, in order. Every job has finished when this returns or
        raises (a failed job's error is raised after the others ended), so no thread
        still writes into a gradient buffer the caller goes on to read."""
        if not jobs:
            return []
        if len(jobs) > self.width:
            raise ValueError(f"{len(jobs)} jobs for {self.width} cores")
        with self._blas.limit(limits=1, user_api="blas"):
            futures = [self._pool.submit(job) for job in jobs[1:]]
            try:
                first = jobs[0]()
            finally:
                wait(futures)
            return [first, *(f.result() for f in futures)]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
