"""One optimiser step on a batch: the verb the trainer and the benchmarks share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .model import ChunkCores, Model
from .optim import AdamW


def train_step(model: Model, opt: AdamW, batch: dict[str, Any],
               chunk_rows: int | None = None,
               between_chunks: Callable[[], None] | None = None,
               cores: ChunkCores | None = None) -> dict[str, float]:
    """Forward, exact backward, clip, AdamW. Returns loss parts, pre-clip norm and lr.

    `chunk_rows`: process the batch in length-sorted chunks (Model.loss_parts_and_grads):
    the same loss and gradient, less padding; `between_chunks` is called after each chunk
    (see there); `cores` runs the chunks a round at a time on several CPU cores.

    The caller checks `finite` before publishing: a step with a non-finite loss or
    gradient leaves the weights and the optimiser state untouched (the update is skipped
    on the device, not applied).
    """
    loss, parts = model.loss_parts_and_grads(batch, chunk_rows, between_chunks, cores)
    # Nothing is read back before the update is queued: on the GPU the losses, the norm
    # and the finite check stay on the device, and the host reads them here, once.
    pending = opt.launch(model.flat, model.grad_flat, (loss, *parts.values()))
    host = np.asarray(model.ops.to_numpy(pending.stats), dtype=np.float64)
    out: dict[str, float] = {"loss": float(host[2]),
                             **{k: float(x) for k, x in zip(parts, host[3:], strict=True)}}
    out.update(opt.finish(pending, host))
    if out["finite"] and model.ewc is not None and model.ewc.lam > 0:
        model.ewc.update_fisher(model.grad_flat)  # the update left the gradient as it was
    return out
