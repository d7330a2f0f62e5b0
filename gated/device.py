"""Choosing the compute backend: `device = "auto" | "cpu" | "cuda"`.

"auto" takes the GPU when CuPy imports, a CUDA device exists and the CuPy backend of the
engine is present; otherwise the CPU, and the reason is logged and exported, so an
operator can tell "no GPU" from "CuPy missing" from "driver broken".
"""

from __future__ import annotations

import importlib.util


def cuda_status() -> tuple[bool, str]:
    """(usable, why) for the CuPy backend on this machine."""
    if importlib.util.find_spec("cupy") is None:
        return False, "CuPy is not installed (pip install 'gated[gpu]')"
    if importlib.util.find_spec("gated.engine.ops_cupy") is None:
        return False, "this build of gated has no CuPy backend yet"
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - any CUDA failure means "use the CPU"
        return False, f"CUDA is not usable: {type(e).__name__}: {e}"
    if n < 1:
        return False, "no CUDA device found"
    return True, f"{n} CUDA device(s)"


def select_backend(device: str) -> tuple[str, str, str]:
    """(backend, device description, reason). Raises RuntimeError for an impossible "cuda"."""
    if device == "cpu":
        return "numpy", "cpu", "device=cpu in the config"
    ok, why = cuda_status()
    if ok:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        return "cupy", f"cuda:0 {name}", f"device={device}: {why}"
    if device == "cuda":
        raise RuntimeError(f"device=cuda was asked for but {why}; set device = \"auto\" or "
                           "\"cpu\" to run on the CPU")
    return "numpy", "cpu", f"device=auto: {why}; using the CPU"
