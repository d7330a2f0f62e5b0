"""The protocol limits (``[limits]`` in the config; docs/protocol.md).

One :class:`Limits` value is what the config's ``[limits]`` section holds, what the wire
decoder and request validator (gated/protocol.py) enforce, and what the signal validator
(gated/signals.py) checks sizes against, so the ``signal``, ``signals`` and ``predict`` ops
share one set of numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

KIB = 1024
MIB = 1024 * KIB
#: LMDB's largest key (its default build): signal ids are keys of the dedup index.
MAX_ID_BYTES_CEILING = 511


@dataclass(frozen=True)
class Limits:
    """Protocol limits, derived from DESIGN section 2 (``[limits]`` in the config).

    Hard limits (fatal, the connection closes): ``max_message_bytes``, ``max_map_len``,
    ``max_array_len``, ``max_ext_bytes``, ``max_items``; and any nesting deeper than
    msgpack's own decoder stack (1024).
    Soft limits (an error reply, the connection stays): ``max_batch``,
    ``max_context_bytes``, ``max_history``, ``max_reason_bytes``, ``max_id_bytes``,
    ``max_depth``.
    Bounds across connections (gated/daemon/connections.py; past one, an error reply with
    rid nil and the connection closes): ``max_connections``, ``max_buffered_bytes``,
    ``read_timeout_s``.
    """

    #: One message, in bytes. A single signal at its largest (64 KiB context plus 16
    #: history entries of up to 64 KiB) is ~1.1 MiB; a batch of 4096 typical signals is a
    #: few MiB.
    max_message_bytes: int = 8 * MIB
    #: Entries of any one map. A signal has 7 fields; 64 leaves room for extensions
    #: while keeping a hostile header from presizing a huge dict.
    max_map_len: int = 64
    #: Elements of any one array, checked at the header, before allocation. Larger than
    #: max_batch so that a slightly-too-big batch still gets a clear (soft) error reply.
    max_array_len: int = 16384
    #: Payload bytes of a msgpack ext value (only useful as an exotic ``rid``).
    max_ext_bytes: int = 64
    #: Decoded objects per message: every map, array and element counts one. Bounds the
    #: Python objects a message can turn into (a 1-byte msgpack value can become a
    #: 50-byte Python object); 4096 signals of ~25 objects each fit.
    max_items: int = 131072
    #: Signals in one ``signals`` request.
    max_batch: int = 4096
    #: UTF-8 bytes of ``context`` and of each ``history`` entry.
    max_context_bytes: int = 64 * KIB
    #: Entries of ``history``.
    max_history: int = 16
    #: UTF-8 bytes of ``reason`` (checked by the signal validator, gated/signals.py).
    max_reason_bytes: int = 4 * KIB
    #: UTF-8 bytes of a signal ``id`` (checked by the signal validator). At most
    #: :data:`MAX_ID_BYTES_CEILING`: the store keys its dedup index by the id.
    max_id_bytes: int = 128
    #: UTF-8 bytes of a signal's ``prediction_id`` (the id a predict/explain reply
    #: carried; the daemon's own are 16 hex digits).
    max_prediction_id_bytes: int = 64
    #: Nesting depth of a request: the request map is 1, ``signals`` 2, a signal 3, its
    #: history 4. Deeper than this (but within the decoder's stack) gets ``too_deep``.
    max_depth: int = 8
    #: Connections open at once; one more gets ``overloaded`` and is closed. Each costs
    #: a task, a decoder and up to one read (256 KiB) of buffers.
    max_connections: int = 256
    #: Bytes received and not yet answered (requests being served, and the incomplete
    #: tail of a message), summed over every connection. A read that would pass it gets
    #: ``overloaded`` and its connection is closed. At least max_message_bytes.
    max_buffered_bytes: int = 64 * MIB
    #: Seconds a message may take to arrive whole, from its first byte (counted while the
    #: daemon reads that connection); past it, ``timeout`` and the connection is closed.
    #: An idle connection (no partial message) is not timed out.
    read_timeout_s: float = field(default=10.0, metadata={"lo": 0.0, "lo_open": True,
                                                          "hi": 3600.0})

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if name == "read_timeout_s":
                if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
                    raise ValueError(f"read_timeout_s must be a positive number of seconds, "
                                     f"got {value!r}")
                continue
            if type(value) is not int or value < 1:
                raise ValueError(f"protocol limit {name} must be a positive integer, got "
                                 f"{value!r}")
        if self.max_buffered_bytes < self.max_message_bytes:
            raise ValueError(f"max_buffered_bytes ({self.max_buffered_bytes}) must be at "
                             f"least max_message_bytes ({self.max_message_bytes}): one "
                             "whole message must fit")
        if self.max_array_len < max(self.max_batch, self.max_history):
            raise ValueError(f"max_array_len ({self.max_array_len}) must be at least "
                             f"max_batch ({self.max_batch}) and max_history "
                             f"({self.max_history})")
        if self.max_id_bytes > MAX_ID_BYTES_CEILING:
            raise ValueError(f"max_id_bytes ({self.max_id_bytes}) must be at most "
                             f"{MAX_ID_BYTES_CEILING}: the store keys its dedup index by "
                             "the signal id, and an LMDB key is at most 511 bytes")
