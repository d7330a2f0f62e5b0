"""Errors of the durable store; every message says what happened, what is kept, what to do."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The LMDB state could not be read or written."""


class StoreFullError(StoreError):
    """A write did not commit because the disk (or the map's configured cap) is full.

    Nothing from the failed write was acknowledged; everything acknowledged before is kept.
    """


class CheckpointMismatch(StoreError):
    """The stored checkpoint belongs to a different model layout or configuration."""
