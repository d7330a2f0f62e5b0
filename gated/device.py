"""Choosing the compute backend: `device = "auto" | "cpu" | "cuda"`, and the GPU preflight.

"auto" takes the GPU when CuPy imports and a CUDA device exists; otherwise the CPU, and
the reason is logged and exported, so an operator can tell "no GPU" from "CuPy missing"
from "driver broken".

Before any weights go to the GPU, :func:`gpu_preflight` checks that the configuration
fits in the device's free memory (:func:`estimate_training_bytes`) and compiles every
kernel, so a GPU that is too small or a broken CUDA toolchain is found at start-up with an
operator message, not at the first training step. :func:`choose_backend` puts the two
together: under "auto" a failed preflight means the CPU (with the reason), under "cuda" it
means the daemon refuses to start.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .engine.config import ModelConfig
from .engine.layout import num_params, param_layout

log = logging.getLogger("gated.device")

GiB = float(1 << 30)
MiB = 1 << 20
#: Device memory the estimate adds for what is not an array of the model: the cuBLAS
#: workspace, the loaded kernel module, the memory pool's rounding.
RUNTIME_OVERHEAD_BYTES = 64 * MiB


def cuda_status() -> tuple[bool, str]:
    """(usable, why) for the CuPy backend on this machine."""
    if importlib.util.find_spec("cupy") is None:
        return False, ("CuPy is not installed (pip install 'gated[gpu]' on CUDA 12 hosts, "
                       "'gated[gpu-cuda13]' on CUDA 13)")
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - any CUDA failure means "use the CPU"
        return False, f"CUDA is not usable: {type(e).__name__}: {e}"
    if n < 1:
        return False, "no CUDA device found"
    return True, f"{n} CUDA device(s)"


def device_name(runtime: Any, device_id: int) -> str:
    """The GPU's marketing name (CUDA hands it over as bytes or str, by CuPy version)."""
    name = runtime.getDeviceProperties(device_id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def select_backend(device: str) -> tuple[str, str, str]:
    """(backend, device description, reason). Raises RuntimeError for an impossible "cuda"."""
    if device == "cpu":
        return "numpy", "cpu", "device=cpu in the config"
    ok, why = cuda_status()
    if ok:
        import cupy

        return "cupy", f"cuda:0 {device_name(cupy.cuda.runtime, 0)}", f"device={device}: {why}"
    if device == "cuda":
        raise RuntimeError(f"device=cuda was asked for but {why}; set device = \"auto\" or "
                           "\"cpu\" to run on the CPU")
    return "numpy", "cpu", f"device=auto: {why}; using the CPU"


# --- memory estimate ------------------------------------------------------------------------


def training_memory_breakdown(cfg: ModelConfig, batch_size: int, src_len: int, tgt_len: int,
                              dtype_bytes: int = 4) -> dict[str, int]:
    """Device bytes of one training process, by part (see :func:`estimate_training_bytes`)."""
    if min(batch_size, src_len, tgt_len, dtype_bytes) < 1:
        raise ValueError("batch_size, src_len, tgt_len and dtype_bytes must be >= 1")
    w = dtype_bytes
    p = num_params(param_layout(cfg))
    b, s, t = batch_size, src_len, tgt_len
    d, h, f, v = cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.vocab_size
    pe = cfg.max_seq_len * d  # the sinusoidal table every Model keeps on its device

    # Forward caches kept for the backward pass, in elements (layers.py, model.py).
    # Encoder layer: LN1 xhat + rstd, the normalised input, q, k, v, the attention
    # probabilities [B,H,S,S], the merged heads o, LN2 xhat + rstd, the FFN input, and the
    # FFN's a, tanh t and hidden h [B,S,d_ff].
    enc_layer = b * (8 * s * d + 2 * s + h * s * s + 3 * s * f)
    # Final encoder LN (xhat + rstd) and its output enc (the decoders' keys and values).
    enc_out = b * (2 * s * d + s)
    # Decoder layer: self-attention as above over T (probabilities [B,H,T,T]); cross-
    # attention: LN2 xhat + rstd, its input, q, o [B,T,d], k and v over the source
    # [B,S,d], probabilities [B,H,T,S]; LN3 and the FFN as in the encoder.
    dec_layer = b * (12 * t * d + 3 * t + 2 * s * d + h * t * t + h * t * s + 3 * t * f)
    # Final decoder LN (xhat + rstd) and its output dec.
    dec_out = b * (2 * t * d + t)
    # The residual stream entering and leaving a layer, the pooled encoder, the gate.
    stream = b * (2 * s * d + 2 * t * d + 2 * d)
    activations = cfg.n_enc_layers * enc_layer + enc_out + stream + \
        cfg.n_dec_layers * dec_layer + dec_out
    logits = 2 * b * t * v  # logits [B*T, V] and dlogits
    # The largest single activation; a backward pass holds about two more of it at once
    # (an attention backward's dP and dS, the cross-entropy's exp buffer).
    largest = max(b * h * s * s, b * h * t * t, b * h * t * s, b * s * f, b * t * f, b * t * v)
    # Token ids (int64) and masks of the batch.
    batch = b * (s + 2 * t) * 8 + b * (2 * s + t) * w + t * t
    return {
        "params": p * w,
        "grads": p * w,
        "adam_m": p * w,
        "adam_v": p * w,
        "decay_mask": p * w,
        # The trainer always allocates the EWC Fisher and anchor buffers.
        "ewc": 2 * p * w,
        # A serving snapshot is a Model (flat + its gradient buffer); during a swap the new
        # snapshot is built while predictions may still hold the old one.
        "serving": 2 * (2 * p + pe) * w,
        "positions": pe * w,
        "activations": activations * w,
        "logits": logits * w,
        "batch": batch,
        "transient": 2 * largest * w,
        "runtime": RUNTIME_OVERHEAD_BYTES,
    }


def estimate_training_bytes(cfg: ModelConfig, batch_size: int, src_len: int, tgt_len: int,
                            dtype_bytes: int = 4) -> int:
    """Device memory (bytes) to train `cfg` on batches of `batch_size` x `src_len` source
    tokens x `tgt_len` target tokens, with the serving snapshot on the same device.

    Counted (see :func:`training_memory_breakdown` for the parts):

    - parameter-sized buffers: the flat weights, their gradients, AdamW m and v, the
      weight-decay mask, the EWC Fisher and anchor (always allocated), and the serving
      snapshot (its flat and gradient buffers) twice, because a swap builds the new one
      while the old one may still be answering; plus each model's positional table;
    - the forward cache of one training step, which the backward pass reads: per
      LayerNorm xhat and rstd; per attention its input, q, k, v, the probabilities
      [B, H, Tq, Tk] and the merged output; per FFN its input and the a, tanh and hidden
      buffers [.., d_ff]; the final LayerNorms and their outputs; the residual stream;
    - logits [B*T, V] and dlogits;
    - the batch's token ids and masks;
    - a transient margin of twice the largest single activation (the scratch of an
      attention or cross-entropy backward);
    - :data:`RUNTIME_OVERHEAD_BYTES` for the cuBLAS workspace, the kernels, the pool.

    Not counted: the CUDA context itself (it is already outside the free memory that
    `cudaMemGetInfo` reports) and the rolled-back-to state, which the trainer keeps in host
    memory. Prediction requests run the encoder only, on small batches, inside the margin.
    """
    return sum(training_memory_breakdown(cfg, batch_size, src_len, tgt_len,
                                         dtype_bytes).values())


def _gib(n: float) -> str:
    """Bytes for an operator: GiB with two decimals, MiB below 1 GiB."""
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


# --- preflight -------------------------------------------------------------------------------


class PreflightError(RuntimeError):
    """The GPU cannot run this configuration; the message tells the operator what to do,
    `info` holds what the preflight measured (device, memory, estimate)."""

    def __init__(self, message: str, info: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.info = info


def gpu_preflight(model_cfg: ModelConfig, train_cfg: Any, *, runtime: Any = None,
                  ops_factory: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Check the GPU before any weights are uploaded; returns what start-up reports.

    Reads the device name and its total and free memory, compares the free memory with
    :func:`estimate_training_bytes` for the largest batch this config trains (the
    configured `batch_size`, sources and reasons of `max_seq_len` tokens), and raises
    :class:`PreflightError` saying how much is needed and free and what to change when it
    does not fit. Then compiles every kernel (``CupyOps().warmup()``), so that a broken
    toolchain fails here and no training step pays a compile. `runtime` (default
    ``cupy.cuda.runtime``) and `ops_factory` (default ``CupyOps``) are seams for tests,
    which have no GPU.
    """
    if runtime is None:
        import cupy

        runtime = cupy.cuda.runtime
    device_id = runtime.getDevice()
    name = device_name(runtime, device_id)
    free, total = (int(x) for x in runtime.memGetInfo())
    batch, length = int(train_cfg.batch_size), model_cfg.max_seq_len
    parts = training_memory_breakdown(model_cfg, batch, length, length)
    need = sum(parts.values())
    info: dict[str, Any] = {"device_id": device_id, "device_name": name, "total_bytes": total,
                            "free_bytes": free, "estimate_bytes": need, "batch_size": batch,
                            "seq_len": length, "breakdown": parts}
    if need > free:
        raise PreflightError(
            f"this configuration needs about {_gib(need)} of GPU memory (batch_size {batch}, "
            f"sequences up to {length} tokens, {num_params(param_layout(model_cfg)):,} "
            f"parameters) but GPU {device_id} ({name}) has {_gib(free)} free of "
            f"{_gib(total)}; lower train.batch_size, use a smaller preset, free the GPU "
            "(nvidia-smi shows what else uses it), or set device = \"cpu\"", info)
    real_gpu = ops_factory is None
    if ops_factory is None:
        from .engine.ops_cupy import CupyOps

        ops_factory = CupyOps
    t0 = time.perf_counter()
    info["kernels"] = int(ops_factory().warmup())
    info["compile_seconds"] = time.perf_counter() - t0
    if real_gpu:
        from .engine.ops_cupy import REDUCTION_ACCELERATORS

        info["reduction_accelerators"] = REDUCTION_ACCELERATORS
        info["reserved_bytes"] = reserve_training_memory(model_cfg, batch)
    return info


def reserve_training_memory(model_cfg: ModelConfig, batch_size: int) -> int:
    """A throwaway model runs one dry step of the largest batch on the GPU (Model.reserve);
    returns the bytes CuPy's pool then holds. The pool keeps those blocks for the real
    model, so training never asks the device for more in the steady state, and a config
    whose real footprint does not fit fails here (out of memory), not at a long batch."""
    import cupy

    from .engine import Model

    pool = cupy.get_default_memory_pool()
    try:
        model = Model.init(model_cfg, seed=0, backend="cupy")
        model.reserve(batch_size)
        del model
        return int(pool.total_bytes())
    except BaseException:
        pool.free_all_blocks()
        raise


def describe_preflight(info: dict[str, Any]) -> str:
    """One log line: device, memory, estimate, kernels."""
    return (f"GPU {info['device_id']} {info['device_name']}: {_gib(info['total_bytes'])} "
            f"total, {_gib(info['free_bytes'])} free; this config needs about "
            f"{_gib(info['estimate_bytes'])} (batch_size {info['batch_size']}, sequences up "
            f"to {info['seq_len']} tokens); {info['kernels']} kernels compiled in "
            f"{info['compile_seconds']:.2f}s"
            + (f"; a dry step of that size holds {_gib(info['reserved_bytes'])}"
               if "reserved_bytes" in info else "")
            # none: gated's default, no CUB compile per input size (docs/operations.md)
            + (f"; CuPy reduction accelerators: "
               f"{', '.join(info['reduction_accelerators']) or 'none'}"
               if "reduction_accelerators" in info else ""))


@dataclass
class BackendChoice:
    """What `gated run` computes on, and why."""

    backend: str  # "numpy" | "cupy"
    device: str  # "cpu" | "cuda:0 <name>"
    reason: str
    # gpu_preflight's report: on the GPU, or after a memory check that failed
    preflight: dict[str, Any] | None = None
    fell_back: bool = False  # a GPU was there but failed the preflight (device = "auto")


def choose_backend(device: str, model_cfg: ModelConfig, train_cfg: Any, *,
                   preflight: Callable[..., dict[str, Any]] | None = None) -> BackendChoice:
    """select_backend, then, for the GPU, the preflight.

    device = "auto": a failed preflight (does not fit, compile error, CUDA error) means
    the CPU, with the preflight's message as the reason. device = "cuda": it raises
    RuntimeError with that message (the daemon refuses to start).
    """
    backend, desc, reason = select_backend(device)
    if backend != "cupy":
        return BackendChoice(backend, desc, reason)
    try:
        info = (preflight or gpu_preflight)(model_cfg, train_cfg)
    except Exception as e:  # noqa: BLE001 - any preflight failure is reported the same way
        if isinstance(e, PreflightError):
            why = str(e)
        else:  # a compile or CUDA error: the whole text (an NVRTC log can be long) goes to
            # the log, the first line to the reason
            log.warning("the GPU preflight failed", exc_info=e)
            first = (str(e).strip().splitlines() or [""])[0]
            why = f"{type(e).__name__}: {first[:300]}"
        if device == "cuda":
            raise RuntimeError(f"device=cuda: the GPU preflight failed: {why}") from e
        return BackendChoice("numpy", "cpu", f"device={device}: the GPU preflight failed: "
                             f"{why}; using the CPU", preflight=getattr(e, "info", None),
                             fell_back=True)
    return BackendChoice(backend, desc, reason, preflight=info)
