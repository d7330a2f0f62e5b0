"""Central-difference gradient checking in float64 (shared by the engine tests)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

H = 1e-4


def numeric_grad_entries(f: Callable[[], float], arr: np.ndarray, idx: list[tuple]) -> np.ndarray:
    """Fourth-order central difference at the given entries of `arr` (perturbed in place):

        (-f(x+2h) + 8 f(x+h) - 8 f(x-h) + f(x-2h)) / 12h

    Its truncation error is O(h^4), so h can be large enough (1e-4) that float64 roundoff
    (~1e-16 |f| / h) stays near 1e-12, which is what makes a 1e-6 relative bound honest.
    """
    out = np.empty(len(idx))
    for k, i in enumerate(idx):
        old = arr[i]
        vals = []
        for step in (2, 1, -1, -2):
            arr[i] = old + step * H
            vals.append(f())
        arr[i] = old
        out[k] = (-vals[0] + 8 * vals[1] - 8 * vals[2] + vals[3]) / (12 * H)
    return out


def rel_error(analytic: np.ndarray, numeric: np.ndarray, floor: float = 1e-4) -> float:
    """max |a - n| / max(|a|, |n|, floor): relative where the gradient is not tiny.

    The floor keeps entries that are exactly 0 in theory (e.g. the key bias of attention,
    which shifts every score of a row equally) from dividing numeric noise (~1e-11) by ~0;
    with a 1e-6 bound it still demands an absolute agreement of 1e-10 there.
    """
    a, n = np.asarray(analytic, float), np.asarray(numeric, float)
    return float(np.max(np.abs(a - n) / np.maximum(np.maximum(np.abs(a), np.abs(n)), floor)))


def sample_indices(shape: tuple, k: int, rng: np.random.Generator) -> list[tuple]:
    size = int(np.prod(shape))
    flat = rng.choice(size, size=min(k, size), replace=False)
    return [np.unravel_index(int(i), shape) for i in flat]


def weighted_bce(z: float, y: float, w: float) -> float:
    """w * BCE(sigmoid(z), y), written the stable way: the reference the wide path's
    finite-difference checks differentiate."""
    return w * (max(z, 0.0) - z * y + np.log1p(np.exp(-abs(z))))
