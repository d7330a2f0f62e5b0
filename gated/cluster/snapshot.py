"""The snapshot object an edge fetches: a self-describing, verifiable blob.

    b"GSNP" | u32 header length (little endian) | msgpack header | float32 weights

The header holds ``format`` (1), ``version``, ``step``, ``calibration`` ([a, b, d],
[a, b, d, allow_open as 1.0 / 0.0], the same with familiar as 1.0 / 0.0 after it, or
None), ``layout`` (the model's layout fingerprint: preset fingerprint and parameter
count), ``dtype`` ("<f4"), ``n``
(parameters), ``sha256`` (hex, of the weight bytes) and ``published_at`` (unix seconds).
The KV key names the object and repeats version, layout and digest, so an edge checks the
object against the pointer and the bytes against both: a truncated, corrupted,
mislabelled or foreign-layout object is refused.
"""

from __future__ import annotations

import hashlib
import struct
import time
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from ..engine import ModelConfig
from ..engine.layout import num_params, param_layout

MAGIC = b"GSNP"
FORMAT = 1


class SnapshotError(ValueError):
    """A snapshot object (or its pointer) that must not be served."""


def layout_fingerprint(cfg: ModelConfig) -> str:
    """What must match for weights to mean the same: every config field and the size."""
    return f"{cfg.fingerprint()}:{num_params(param_layout(cfg))}"


def object_name(version: int) -> str:
    return f"snapshot-{version:012d}"


@dataclass(frozen=True)
class Decoded:
    version: int
    step: int
    #: (a, b), (a, b, d), (a, b, d, allow_open) or (a, b, d, allow_open, familiar):
    #: serving.Calibration
    calibration: tuple[float, ...] | None
    flat: np.ndarray
    header: dict[str, Any]


def encode(version: int, flat: np.ndarray, *, step: int, calibration: Any, layout: str,
           published_at: float | None = None) -> tuple[bytes, dict[str, Any]]:
    """(object bytes, pointer) for `flat` as `version`. The pointer is what the KV key
    holds (JSON-able)."""
    body = np.ascontiguousarray(flat, dtype="<f4").tobytes()
    digest = hashlib.sha256(body).hexdigest()
    header = {"format": FORMAT, "version": int(version), "step": int(step),
              "calibration": [float(x) for x in calibration] if calibration else None,
              "layout": layout, "dtype": "<f4", "n": len(body) // 4, "sha256": digest,
              "published_at": time.time() if published_at is None else published_at}
    head = msgpack.packb(header)
    blob = MAGIC + struct.pack("<I", len(head)) + head + body
    pointer = {"version": header["version"], "object": object_name(version),
               "sha256": digest, "layout": layout, "size": len(blob),
               "published_at": header["published_at"]}
    return blob, pointer


def decode(blob: bytes | bytearray | memoryview, pointer: dict[str, Any],
           layout: str) -> Decoded:
    """Verify `blob` against the KV `pointer` and this node's `layout`, and decode it.
    Raises SnapshotError naming what is wrong."""
    mv = memoryview(blob)
    if len(mv) < 8 or bytes(mv[:4]) != MAGIC:
        raise SnapshotError(f"not a gated snapshot ({len(mv)} bytes, bad magic)")
    (hlen,) = struct.unpack("<I", mv[4:8])
    if 8 + hlen > len(mv):
        raise SnapshotError(f"truncated: header of {hlen} bytes, object of {len(mv)}")
    try:
        header = msgpack.unpackb(mv[8:8 + hlen])
    except Exception as e:  # noqa: BLE001 - any decoding failure is a corrupt header
        raise SnapshotError(f"unreadable header: {e}") from e
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise SnapshotError(f"unknown snapshot format {header!r:.80}")
    if header.get("layout") != layout:
        raise SnapshotError(f"layout {header.get('layout')!r} is not this node's {layout!r} "
                            "(a different preset or model version)")
    for key in ("version", "sha256", "layout"):
        if pointer.get(key) != header.get(key):
            raise SnapshotError(f"the object's {key} {header.get(key)!r} is not the "
                                f"pointer's {pointer.get(key)!r}")
    body = mv[8 + hlen:]
    n = int(header.get("n", -1))
    if header.get("dtype") != "<f4" or len(body) != 4 * n:
        raise SnapshotError(f"truncated or padded weights: {len(body)} bytes for {n} "
                            "float32 parameters")
    digest = hashlib.sha256(body).hexdigest()
    if digest != header["sha256"]:
        raise SnapshotError(f"SHA-256 mismatch: the weights hash to {digest[:16]}..., the "
                            f"header says {header['sha256'][:16]}...")
    flat = np.frombuffer(body, dtype="<f4").astype(np.float32, copy=True)
    if not np.isfinite(flat).all():
        raise SnapshotError("non-finite weights")
    cal = header.get("calibration")
    return Decoded(int(header["version"]), int(header.get("step", 0)),
                   tuple(float(x) for x in cal[:5]) if cal else None, flat, header)
