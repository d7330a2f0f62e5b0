"""Key and value encodings shared by the store's databases."""

from __future__ import annotations

import struct
import threading
from typing import Any

import msgpack

_U64 = struct.Struct(">Q")


def u64(n: int) -> bytes:
    """8-byte big-endian key: LMDB's byte order then equals numeric order."""
    return _U64.pack(n)


def from_u64(b: bytes | memoryview) -> int:
    return _U64.unpack(b)[0]


def _default(obj: Any) -> Any:
    # NumPy scalars and small arrays in metric records or checkpoint `extra`.
    if hasattr(obj, "item") and getattr(obj, "shape", None) == ():
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, tuple | set | frozenset):
        return list(obj)
    raise TypeError(f"cannot store a value of type {type(obj).__name__}")


_PACKERS = threading.local()
#: a thread's Packer is reused only while what it packs stays under this many bytes
_KEEP_PACKER_BELOW = 1 << 20


def pack(obj: Any) -> bytes:
    """msgpack bytes of `obj`. One `msgpack.Packer` per thread, reused: `msgpack.packb`
    builds a new one per call, which was a fifth of the signal log's per-signal cost
    (bench_ingest.py). A Packer is not thread-safe, and it empties its buffer when a
    `pack` raises, so a failed record leaves nothing behind for the next one. Its buffer
    keeps the size of the largest object it packed, so after a large one (a checkpoint
    head with a big ``extra``) the thread's Packer is dropped rather than kept."""
    try:
        packer = _PACKERS.packer
    except AttributeError:
        packer = _PACKERS.packer = msgpack.Packer(use_bin_type=True, default=_default)
    data = packer.pack(obj)
    if len(data) > _KEEP_PACKER_BELOW:
        del _PACKERS.packer
    return data


def unpack(data: bytes | memoryview) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)
