"""One optimiser step on a batch: the verb the trainer and the benchmarks share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .model import Model
from .optim import AdamW


def train_step(model: Model, opt: AdamW, batch: dict[str, Any],
               chunk_rows: int | None = None,
               between_chunks: Callable[[], None] | None = None) -> dict[str, float]:
    """Forward, exact backward, clip, AdamW. Returns loss parts, pre-clip norm and lr.

    `chunk_rows`: process the batch in length-sorted chunks (Model.loss_parts_and_grads):
    the same loss and gradient, less padding; `between_chunks` is called after each chunk
    (see there).

    The caller checks `finite` before publishing: a step with a non-finite loss or
    gradient leaves the weights untouched (the update is skipped, not applied).
    """
    loss, parts = model.loss_parts_and_grads(batch, chunk_rows, between_chunks)
    out: dict[str, float] = {"loss": float(loss), **{k: float(v) for k, v in parts.items()}}
    finite = model.ops.all_finite(model.grad_flat) and loss == loss and abs(loss) != float("inf")
    out["finite"] = float(finite)
    if not finite:
        out.update(grad_norm=float("nan"), lr=opt.schedule.at(opt.t + 1))
        return out
    if model.ewc is not None and model.ewc.lam > 0:
        model.ewc.update_fisher(model.grad_flat)
    out.update(opt.step(model.flat, model.grad_flat))
    return out
