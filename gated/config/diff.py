"""The reload policy: which changed keys a reload applies, which need a restart.

Pure: the daemon's reload machinery (gated/daemon/reload.py) re-reads the file and calls
:func:`diff_reload`; only the keys of :data:`SAFE_KEYS` (``hot`` in the schema) change in a
running daemon.
"""

from __future__ import annotations

import dataclasses

from .schema import SAFE_KEYS, SECTIONS, Config, section_fields


def diff_reload(old: Config, new: Config) -> tuple[Config, list[str], list[str]]:
    """What a reload from ``old`` to ``new`` does.

    Returns ``(applied, applied_keys, refused_keys)``: ``applied`` is ``old`` with every
    changed key of :data:`SAFE_KEYS` taken from ``new``; ``refused_keys`` are the changed
    keys that need a restart (they keep their ``old`` values).
    """
    applied_keys: list[str] = []
    refused_keys: list[str] = []
    sections = {}
    for sec in SECTIONS:
        o, n = getattr(old, sec), getattr(new, sec)
        changes = {}
        for name in section_fields(sec):
            if getattr(o, name) != getattr(n, name):
                key = f"{sec}.{name}"
                if key in SAFE_KEYS:
                    changes[name] = getattr(n, name)
                    applied_keys.append(key)
                else:
                    refused_keys.append(key)
        sections[sec] = dataclasses.replace(o, **changes) if changes else o
    return Config(**sections), applied_keys, refused_keys
