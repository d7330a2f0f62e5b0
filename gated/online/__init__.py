"""Online-learning verbs the trainer composes: progressive validation, calibration, drift.

Each is a small object with `update`-style methods and a `state()`/`load()` pair so the
trainer can checkpoint it with its weights (a restart reports the same numbers).
"""

from .calibration import PlattCalibrator, brier_score, expected_calibration_error
from .drift import PageHinkley
from .progressive import AlignmentWindow, CorrectedAlignment

__all__ = ["AlignmentWindow", "CorrectedAlignment", "PageHinkley", "PlattCalibrator",
           "brier_score", "expected_calibration_error"]
