"""Key and value encodings shared by the store's databases."""

from __future__ import annotations

import struct
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


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, default=_default)


def unpack(data: bytes | memoryview) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)
