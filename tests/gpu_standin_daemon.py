"""`gated run` on the stand-in GPU of tests/gpu_standin.py, for the end-to-end tests.

Run as ``python tests/gpu_standin_daemon.py run ...`` (same arguments as ``gated run``).
It makes the machine look like it has one GPU (select_backend says so, the preflight
reads a fake CUDA runtime and compiles fake kernels) and makes backend "cupy" the
failing NumPy stand-in, then runs the real daemon. There is no GPU on CI; this is how
the daemon's GPU start-up and fallback paths run there end to end.

Environment:
  GATED_STANDIN_FAIL_ADAMW   comma-separated numbers of the trainer's adamw calls that
                             fail (e.g. "4,5,6": three failures in a row)
  GATED_STANDIN_FREE_MIB     free memory the fake runtime reports (default 70 GiB)
  GATED_STANDIN_TOTAL_MIB    total memory (default 80 GiB)
"""

from __future__ import annotations

import os
import sys

from gpu_standin import FakeKernels, FakeRuntime, StandInGpuOps, install

import gated.daemon.trainer.rehearsal as rehearsal
import gated.device as device
from gated import cli

MiB = 1 << 20


def install_standin() -> None:
    """Patch this process. Called at import: the trainer process is spawned, and spawn
    imports this (the parent's main) module in the child, so the child is patched too."""
    fail = {int(x) for x in os.environ.get("GATED_STANDIN_FAIL_ADAMW", "").split(",") if x}
    made: list[StandInGpuOps] = []
    rehearsing: list[bool] = []

    def factory() -> StandInGpuOps:
        # In the trainer process the trainer's model asks first (build_trainer), then
        # its serving snapshots; in the daemon only serving snapshots ask (no adamw).
        # The rehearsal's throwaway trainer comes before them all: it fails nothing.
        if rehearsing:
            return StandInGpuOps(fail_adamw=())
        ops = StandInGpuOps(fail_adamw=fail if not made else ())
        made.append(ops)
        return ops

    install(setattr, factory)
    real_rehearse = rehearsal.rehearse

    def rehearse(*args, **kwargs):
        rehearsing.append(True)
        try:
            return real_rehearse(*args, **kwargs)
        finally:
            rehearsing.pop()

    rehearsal.rehearse = rehearse

    def select_backend(dev: str) -> tuple[str, str, str]:
        if dev == "cpu":
            return "numpy", "cpu", "device=cpu in the config"
        return "cupy", "cuda:0 Stand-in GPU", f"device={dev}: 1 CUDA device(s) (stand-in)"

    free = int(os.environ.get("GATED_STANDIN_FREE_MIB", 70 * 1024)) * MiB
    total = int(os.environ.get("GATED_STANDIN_TOTAL_MIB", 80 * 1024)) * MiB
    real_preflight = device.gpu_preflight

    def gpu_preflight(model_cfg, train_cfg):
        return real_preflight(model_cfg, train_cfg, runtime=FakeRuntime(free, total),
                              ops_factory=FakeKernels)

    device.select_backend = select_backend
    device.gpu_preflight = gpu_preflight


install_standin()


def main() -> int:
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
