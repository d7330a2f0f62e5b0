"""The online learner: the training loop (loop.py), its controls from other threads
(control.py), the response to drift alarms (drift.py), the wide path's schedule
(wide_path.py), publication, rollback and checkpoints (publication.py), the promotion
gate (promotion.py), resuming from a checkpoint (resume.py), the GPU -> CPU fallback
(gpu.py) and the replay filter (latest.py), and the rehearsal a GPU trainer runs before
its first signal (rehearsal.py). It runs in the trainer process
(daemon/trainer_process.py); benchmarks run it in-process."""

from .gpu import GPU_BACKENDS, GPU_FAILURES_BEFORE_CPU
from .loop import AlignmentWindow, Trainer, TrainerEvents
from .resume import build_trainer

__all__ = ["GPU_BACKENDS", "GPU_FAILURES_BEFORE_CPU", "AlignmentWindow", "Trainer", "TrainerEvents",
           "build_trainer"]
