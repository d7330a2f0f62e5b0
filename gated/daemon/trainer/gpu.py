"""The GPU -> CPU fallback of the trainer.

On the GPU, a step that raises (a CUDA error, out of memory, a failed kernel launch) is
rolled back like a diverged one and counted; after GPU_FAILURES_BEFORE_CPU failures in a
row the trainer moves itself and its serving snapshot to the CPU, keeping the last good
weights and optimiser state, and goes on training. On the CPU an exception is a bug and
still surfaces (the trainer process exits and its supervisor restarts it).
"""

from __future__ import annotations

import logging

from ...engine import Model
from ...store import StoreError

log = logging.getLogger("gated.trainer")

#: Backends whose exceptions are treated as device failures.
GPU_BACKENDS = frozenset({"cupy"})
#: Consecutive GPU failures after which the trainer switches to the CPU.
GPU_FAILURES_BEFORE_CPU = 3


class GpuFallback:
    """Mixin of `Trainer`: what to do when the GPU fails. Uses the trainer's model, good
    state, serving snapshot, store and events."""

    gpu_failures_before_cpu = GPU_FAILURES_BEFORE_CPU
    _gpu_failures = 0  # consecutive

    @property
    def on_gpu(self) -> bool:
        """True while the training model runs on a GPU backend."""
        return getattr(self.model.ops, "name", "numpy") in GPU_BACKENDS

    def _gpu_error(self, e: Exception, where: str) -> bool:
        """Handle an exception raised while training on the GPU: roll back, count, and
        after `gpu_failures_before_cpu` in a row switch to the CPU. Returns False (the
        caller re-raises) on the CPU and for store errors, which are not the GPU's."""
        if not self.on_gpu or isinstance(e, StoreError):
            return False
        self._gpu_failures += 1
        reason = f"{type(e).__name__}: {e}"
        log.warning("GPU error during %s (%d in a row; the CPU takes over at %d): %s", where,
                    self._gpu_failures, self.gpu_failures_before_cpu, reason, exc_info=e)
        if self._gpu_failures >= self.gpu_failures_before_cpu:
            self._switch_to_cpu(reason)
            return True
        try:
            self._rollback(f"GPU error: {reason}")
        except Exception as e2:  # noqa: BLE001 - the device cannot even copy memory back
            log.warning("restoring the last good state on the GPU failed too (%s: %s); not "
                        "retrying on it", type(e2).__name__, e2)
            self._switch_to_cpu(f"{reason}; restoring on the GPU then failed with "
                                f"{type(e2).__name__}: {e2}")
        return True

    def _switch_to_cpu(self, reason: str) -> None:
        """Rebuild the model, AdamW and EWC on NumPy from the last good (host) state, move
        the serving snapshot to the CPU, tell the operator, and go on training."""
        old, g = self.model, self._good
        n = self._gpu_failures
        ewc_state = None
        if old.ewc is not None and old.ewc.consolidated:
            try:
                ewc_state = {k: old.ops.to_numpy(a) for k, a in old.ewc.state().items()}
            except Exception as e:  # noqa: BLE001 - the GPU may no longer answer
                log.warning("the EWC state could not be read back from the GPU (%s); EWC "
                            "starts over on the CPU", e)
        model = Model.from_flat(old.cfg, g.flat, backend="numpy", dtype=str(old.dtype))
        self._install(model, {"m": g.m, "v": g.v, "t": g.t}, ewc_state)
        self.apply_settings(self.settings)
        self._move_serving_to_cpu()
        # self._good stays: the new model and AdamW hold copies of it, not views.
        self._steps_since_swap = 0  # the weights are the last published ones again
        self._gpu_failures = 0
        self._count_rollback(f"GPU error: {reason}")
        log.error("GPU training failed %d %s in a row (last error: %s); switched to the "
                  "CPU; weights and optimizer state kept; check the GPU (nvidia-smi) and "
                  "restart to use it again", n, "time" if n == 1 else "times", reason)
        self.events.on_gpu_fallback(reason)

    def _move_serving_to_cpu(self) -> None:
        try:
            self.serving.move_to("numpy")
            return
        except Exception as e:  # noqa: BLE001 - the GPU may no longer answer
            log.warning("reading the serving weights back from the GPU failed (%s: %s); "
                        "serving the last published weights", type(e).__name__, e)
        flat = self._good.flat
        try:
            published = self.store.load_published()
            if published is not None and published[0] == self.serving.current.version:
                flat = published[1]
        except Exception as e:  # noqa: BLE001 - fall back to the trainer's good state
            log.warning("reading the published weights from the store failed (%s)", e)
        self.serving.move_to("numpy", flat=flat)
