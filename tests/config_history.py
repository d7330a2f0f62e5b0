"""The config fingerprint as an older code computed it, for the tests that pin that a state
stored before a field existed still loads."""

from __future__ import annotations

import dataclasses
import hashlib
import json


def fingerprint_before(cfg, *later_fields: str) -> str:
    """blake2b over every field of `cfg` but `later_fields`, the fields the older code did not
    have: written out here, not through `ModelConfig.fingerprint`, so that a change there
    cannot move both sides of the comparison."""
    old = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in later_fields}
    return hashlib.blake2b(json.dumps(old, sort_keys=True).encode(), digest_size=12).hexdigest()
