"""Many hosts on NATS JetStream (docs/cluster.md): `gated run --role edge` next to every
gateway, `gated run --role trainer` once.

- nats.py      connecting, the stream, the consumer, the KV and Object Store buckets;
               where the installed `nats-server` binary is
- snapshot.py  the snapshot object: header (version, step, calibration, layout
               fingerprint, SHA-256) + float32 weights; encode, decode and verify
- metrics.py   the gated_cluster_* Prometheus series (every role)
- edge.py      EdgeDaemon: signals acknowledged only after JetStream acknowledged them;
               predictions from the newest snapshot the KV key names
- trainer_role.py  TrainerDaemon: the durable consumer into the LMDB log (ack after the
               commit), each published version to the Object Store and the KV key

Only `gated run --role edge|trainer` imports this package (it needs `nats-py`, the
`cluster` extra); the single-host daemon never does.
"""

from __future__ import annotations


def daemon_class(role: str) -> type:
    """The Daemon subclass of a cluster role."""
    if role == "edge":
        from .edge import EdgeDaemon
        return EdgeDaemon
    if role == "trainer":
        from .trainer_role import TrainerDaemon
        return TrainerDaemon
    raise ValueError(f"unknown cluster role {role!r}")
