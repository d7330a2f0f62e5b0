"""A stand-in for a GPU, for testing the daemon's GPU preflight and fallback on CI.

CI (and the development machine) has no GPU and no CuPy, so nothing here touches CUDA.
`StandInGpuOps` is the NumPy backend under the name of the GPU backend ("cupy"): the
trainer treats its exceptions as device failures, exactly as it treats CuPy's. It fails
on purpose, the way a GPU does: `adamw` can half-write the weights and then raise a
launch failure; `sigmoid` (serving) and `to_numpy` (reading weights back) can raise too.
`FakeRuntime` and `FakeKernels` stand in for `cupy.cuda.runtime` and `CupyOps` in the
preflight. None of this proves anything about a real GPU; it proves what the daemon does
when the backend it runs on raises.
"""

from __future__ import annotations

from gated.engine.ops_numpy import NumpyOps


class StandInCudaError(RuntimeError):
    """Plays cupy.cuda.runtime.CUDARuntimeError."""


class StandInGpuOps(NumpyOps):
    """NumPy maths under the GPU backend's name, with failures on request.

    `fail_adamw`: 1-based numbers of this instance's `adamw` calls that fail (after
    scribbling over half the weights, as a kernel dying mid-update would).
    `fail_gate`: how many of the next gate-head pools (`mean_pool`: every prediction
    and every step runs it; set it on the serving model's ops) fail.
    `dead`: every `to_numpy` raises (a device that no longer answers).
    """

    name = "cupy"

    def __init__(self, fail_adamw=(), fail_gate: int = 0, dead: bool = False) -> None:
        self.fail_adamw = set(fail_adamw)
        self.fail_gate = fail_gate
        self.dead = dead
        self.adamw_calls = 0

    def adamw(self, p, g, m, v, decay, **kw):
        self.adamw_calls += 1
        if self.adamw_calls in self.fail_adamw:
            p[: p.size // 2] = 1e3  # half-written update
            m[: m.size // 2] = 1e3
            raise StandInCudaError("cudaErrorLaunchFailure: unspecified launch failure "
                                   f"(stand-in, adamw call {self.adamw_calls})")
        return super().adamw(p, g, m, v, decay, **kw)

    def mean_pool(self, x, mask):
        if self.fail_gate > 0:
            self.fail_gate -= 1
            raise StandInCudaError("cudaErrorIllegalAddress: an illegal memory access was "
                                   "encountered (stand-in, serving)")
        return super().mean_pool(x, mask)

    def to_numpy(self, a):
        if self.dead:
            raise StandInCudaError("cudaErrorLaunchFailure: the device no longer answers "
                                   "(stand-in)")
        return super().to_numpy(a)


def install(monkeypatch_setattr, factory=StandInGpuOps) -> list[StandInGpuOps]:
    """Make backend "cupy" build `factory()` ops; returns the list of instances made
    (in order: whoever asks first gets [0]). `monkeypatch_setattr(obj, name, value)`."""
    import gated.engine.model as engine_model

    real = engine_model.get_ops
    made: list[StandInGpuOps] = []

    def get_ops(backend: str):
        if backend == "cupy":
            ops = factory()
            made.append(ops)
            return ops
        return real(backend)

    monkeypatch_setattr(engine_model, "get_ops", get_ops)
    return made


class FakeRuntime:
    """Plays cupy.cuda.runtime for gpu_preflight: one device, the memory we say."""

    def __init__(self, free: int, total: int, name: str = "Stand-in GPU 80GB") -> None:
        self.free, self.total, self.name = free, total, name

    def getDevice(self) -> int:  # noqa: N802 - CUDA's spelling
        return 0

    def getDeviceProperties(self, device: int) -> dict:  # noqa: N802
        return {"name": self.name.encode()}

    def memGetInfo(self) -> tuple[int, int]:  # noqa: N802
        return self.free, self.total


class FakeKernels:
    """Plays CupyOps for the preflight: `warmup()` "compiles" 13 kernels or fails."""

    calls = 0

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def warmup(self) -> int:
        FakeKernels.calls += 1
        if self.error is not None:
            raise self.error
        return 13
