"""The GPU backend: KernelOps' launches on CuPy, matmuls on cuBLAS through `cupy.matmul`.

Imported only when the backend is asked for (CuPy is the optional `gpu` extra). The
kernels are compiled by NVRTC once per process (CuPy caches the binary on disk too);
`warmup()` compiles them all up front so that a broken toolchain fails at start-up, not
at the first training step, and so that no step pays a compile.
"""

from __future__ import annotations

import os

import cupy
import cupy.cublas
import numpy as np

from .ops_kernels import KERNEL_NAMES, KERNEL_SOURCE, NVRTC_OPTIONS, KernelOps

_module: cupy.RawModule | None = None


def reductions_compiled_once() -> list[str]:
    """CuPy's own reduction kernels for every sum, max, any and all of this process,
    unless the operator chose accelerators (`CUPY_ACCELERATORS` set); returns the
    reduction accelerators in use, by name (the GPU preflight logs them).

    Why (measured on an H200, docs/learning.md "Compile stalls on a GPU"): with CuPy's
    CUB accelerator a whole-array reduction compiled a new kernel for each new size class
    of its input (1.5-5.5 s each, with NVRTC): the loss sum of a step, the finite check of a
    swap, the checks inside cupy.bincount. Batches change size with every step early in a
    stream, so the trainer stalled 4-11 s at a time in its first hundreds of signals, and
    every signal that arrived meanwhile was scored by a snapshot that had learned from a
    handful. CuPy's own reduction kernel is compiled once per dtype and rank, which the
    start-up rehearsal covers; the arrays reduced here are small (a step's rows, one
    parameter vector), where CUB's speed does not show."""
    from cupy._core import _accelerator

    if "CUPY_ACCELERATORS" not in os.environ:
        _accelerator.set_reduction_accelerators([])
        _accelerator.set_routine_accelerators([])
    names = {_accelerator.ACCELERATOR_CUB: "cub", _accelerator.ACCELERATOR_CUTENSOR: "cutensor"}
    return [names.get(a, str(a)) for a in _accelerator.get_reduction_accelerators()]


REDUCTION_ACCELERATORS = reductions_compiled_once()


def kernel_module() -> cupy.RawModule:
    """The one RawModule of this process (kernels are compiled on first use)."""
    global _module
    if _module is None:
        _module = cupy.RawModule(code=KERNEL_SOURCE.read_text(), options=NVRTC_OPTIONS)
    return _module


class CupyOps(KernelOps):
    """Every fused operation of a training step as a CUDA kernel; arrays are cupy arrays."""

    name = "cupy"
    xp = cupy

    def __init__(self) -> None:
        self._functions: dict[str, cupy.RawKernel] = {}

    def warmup(self) -> int:
        """Compile and load every kernel now; returns how many (raises on any failure)."""
        for name in KERNEL_NAMES:
            self._function(name)
        return len(KERNEL_NAMES)

    def _function(self, name: str):
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions[name] = kernel_module().get_function(name)
        return fn

    def _launch(self, kernel: str, grid: int, block: int, args: tuple) -> None:
        self._function(kernel)((grid,), (block,), args)

    def _matmul_tn_add(self, out, a, b) -> None:
        """out += a^T b in ONE cuBLAS GEMM with beta = 1, straight into the gradient view:
        no temporary, no add kernel (cupy.matmul would allocate the product first)."""
        cupy.cublas.gemm("T", "N", a, b, out=out, alpha=1.0, beta=1.0)

    def to_numpy(self, a) -> np.ndarray:
        return cupy.asnumpy(a)

    @staticmethod
    def synchronize() -> None:
        cupy.cuda.get_current_stream().synchronize()

