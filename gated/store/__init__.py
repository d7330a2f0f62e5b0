"""Durable state in LMDB: nothing acknowledged is ever lost (DESIGN.md section 4).

Public API::

    from gated.store import Store, GroupCommitter, load_published, backup, inspect

    store = Store(state_dir)                      # one env per process, grows on demand
    store.append_signals(signals) -> [(seq, duplicate)]   # returns after the commit
    committer = GroupCommitter(store)             # many callers, one fsync per round
    committer.submit(signals) -> Future[[(seq, duplicate)]]
    await committer.submit_async(signals)         # from an event loop (the daemon)
    store.read_signals(after_seq, limit) -> [(seq, signal)]
    store.save_checkpoint(...); store.load_checkpoint(layout=..., config_fingerprint=...)
    store.publish(version, flat, step=...); load_published(state_dir) -> (version, flat)
    store.reservoir_add(examples, rng); store.reservoir_sample(n, rng)
    store.append_metrics(step, record); store.read_metrics(limit)
    store.prune(max_age_s=..., max_count=...)
    store.overrides_apply(puts, deletes); store.audit_write(records, links, ...)
    read_audit(state_dir, since=..., tool=...)   # `gated audit`, read-only

Module layout: `env` (environment registry, transactions, map growth, error mapping),
`disk` (free space, the start-up check, the lock file's reserved blocks), `log` (signal
log, dedup, escalation, retention), `replay`, `checkpoint` (checkpoint and published
snapshots), `history` (metrics), `group` (group commit), `admin` (backup, inspect),
`trust` (override memory, audit log).
"""

from .admin import backup, format_inspect, inspect
from .checkpoint import Checkpoint, load_published
from .core import Store
from .env import DEFAULT_MAP_SIZE, DEFAULT_MAX_MAP_SIZE, close_readers
from .errors import CheckpointMismatch, StoreError, StoreFullError
from .group import GroupCommitter
from .trust import read_audit

__all__ = [
    "DEFAULT_MAP_SIZE",
    "DEFAULT_MAX_MAP_SIZE",
    "Checkpoint",
    "CheckpointMismatch",
    "GroupCommitter",
    "Store",
    "StoreError",
    "StoreFullError",
    "backup",
    "close_readers",
    "format_inspect",
    "inspect",
    "load_published",
    "read_audit",
]
