"""Checking values against the schema: types, ranges, choices, cross-key rules.

A bad value is a :class:`ConfigError` naming the key, the value, where it came from and
what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from .limits import Limits
from .schema import SECTIONS, Config, ConfigError, section_fields


def _fmt_range(md: Mapping[str, Any]) -> str:
    parts = []
    if md.get("lo") is not None:
        parts.append(f"{'>' if md.get('lo_open') else '>='} {md['lo']:g}")
    if md.get("hi") is not None:
        parts.append(f"{'<' if md.get('hi_open') else '<='} {md['hi']:g}")
    return " and ".join(parts)


def _coerce(key: str, value: Any, default: Any, md: Mapping[str, Any], source: str) -> Any:
    """Type-check ``value`` against the type of ``default`` and check its range/choices."""
    given = value

    def bad(why: str) -> ConfigError:
        return ConfigError(f"{source}: {key} = {given!r} {why}", key=key, value=given)

    if md.get("ids"):  # [access]: user or group ids or names, maybe none
        if not isinstance(value, (list, tuple)) or any(
                not ((type(x) is int and 0 <= x < 2**32 - 1) or (type(x) is str and x))
                for x in value):
            raise bad("must be an array of user or group ids (integers >= 0) or names "
                      "(non-empty strings), e.g. [\"gateway\", 1001]")
        return tuple(value)

    if isinstance(default, bool):  # pragma: no cover - no bool keys today
        if not isinstance(value, bool):
            raise bad("must be true or false")
        return value
    if isinstance(default, int):
        if type(value) is not int:
            raise bad("must be an integer")
        nums = [value]
    elif isinstance(default, float):
        if type(value) not in (int, float):
            raise bad("must be a number")
        value = float(value)
        nums = [value]
    elif isinstance(default, str):
        if not isinstance(value, str):
            raise bad("must be a string")
        if md.get("choices"):
            if key == "daemon.log_level":
                value = value.upper()
            if value not in md["choices"]:
                raise bad(f"must be one of {', '.join(repr(c) for c in md['choices'])}")
        nums = []
    elif isinstance(default, tuple) and md.get("items") == "str":
        if not isinstance(value, (list, tuple)) or any(not isinstance(x, str) for x in value):
            raise bad("must be an array of strings")
        value = tuple(value)
        nums = []
    elif isinstance(default, tuple):
        if not isinstance(value, (list, tuple)) or not value or \
                any(type(x) not in (int, float) for x in value):
            raise bad("must be a non-empty array of numbers")
        value = tuple(float(x) for x in value)
        nums = list(value)
    else:  # pragma: no cover
        raise TypeError(f"unsupported config type for {key}")
    for x in nums:
        if isinstance(x, float) and not math.isfinite(x):
            raise bad("must be finite")
        lo, hi = md.get("lo"), md.get("hi")
        if (lo is not None and (x < lo or (md.get("lo_open") and x == lo))) or \
                (hi is not None and (x > hi or (md.get("hi_open") and x == hi))):
            raise bad(f"is out of range: must be {_fmt_range(md)}")
    check = md.get("check")
    if check is not None:
        why = check(value)
        if why:
            raise bad(why)
    return value


def build_section(section: str, values: Mapping[str, Any],
                   sources: Mapping[str, str]) -> Any:
    """The section's dataclass from ``values`` (checked); ``sources`` names where each
    value came from, for error messages."""
    cls = SECTIONS[section]
    kwargs = {}
    for name, f in section_fields(section).items():
        if name not in values:
            continue
        md = dict(f.metadata)
        if cls is Limits:
            md.setdefault("lo", 1)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kwargs[name] = _coerce(f"{section}.{name}", values[name], default, md,
                               sources.get(name, "defaults"))
    try:
        return cls(**kwargs)
    except ValueError as e:  # Limits' own cross-checks
        where = " / ".join(sorted(set(sources.values()))) or "defaults"
        raise ConfigError(f"{where}: [{section}] {e}") from e


def cross_check(cfg: Config, source: str) -> None:
    b = cfg.bands
    if b.block > b.allow:
        raise ConfigError(f"{source}: bands.block = {b.block:g} is above bands.allow = "
                          f"{b.allow:g}: block must be <= allow (p in between is 'ask')",
                          key="bands.block", value=b.block)
    t = cfg.train
    if t.lambda_bce == 0 and t.lambda_ce == 0:
        raise ConfigError(f"{source}: train.lambda_bce and train.lambda_ce are both 0: "
                          "nothing would be learned; set at least one > 0",
                          key="train.lambda_bce", value=0.0)
