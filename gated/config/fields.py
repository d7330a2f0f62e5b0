"""How a config key is declared: a dataclass field whose metadata the rest of the package reads.

One place for it, so that :mod:`gated.config.schema` and :mod:`gated.config.train` (the
``[train]`` section, the largest, in a file of its own) declare keys the same way, and
gated/config/validate.py, ``gated.example.toml`` and the tests read one format.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any


def _opt(default: Any, doc: str, *, hot: bool = False, lo: float | None = None,
         hi: float | None = None, lo_open: bool = False, hi_open: bool = False,
         choices: tuple[str, ...] | None = None,
         check: Callable[[Any], str | None] | None = None, items: str | None = None) -> Any:
    """A config field: default, one-line doc, hot-reloadable or not, allowed values.

    ``check(value)`` returns an error text (or None) for rules a range cannot express.
    ``items="str"`` makes a tuple default an array of strings (possibly empty) instead of
    a non-empty array of numbers.
    """
    return field(default=default, metadata={
        "doc": doc, "hot": hot, "lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open,
        "choices": choices, "check": check, "items": items})
