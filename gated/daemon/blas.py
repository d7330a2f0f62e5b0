"""BLAS threads per process: serving and the trainer each get their own share of the cores.

threadpoolctl limits only the libraries already loaded, so numpy (and with it OpenBLAS)
is imported first. Without that the limit is a silent no-op and BLAS later starts with a
thread per core: the trainer process limited itself before importing the engine until
2026-11-29, so on a 2-core host its GEMMs ran on both cores, the serving core included,
at nice 10: ~1.4 cores of CPU for half the signals taken in (bench/bench_live.py and
bench_predict.py, docs/learning.md "The daemon as deployed, in real time").
"""

from __future__ import annotations


def limit_blas_threads(n: int) -> list[int]:
    """Limit this process's BLAS (and OpenMP) pools to `n` threads; returns the BLAS pools'
    thread counts afterwards, for the log (empty if no BLAS library is loaded)."""
    import numpy  # noqa: F401  -- loads the BLAS library threadpoolctl must see
    from threadpoolctl import threadpool_info, threadpool_limits

    threadpool_limits(limits=n)
    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
