"""Where the config comes from: defaults < TOML file < command-line flags.

Validation is strict: an unknown section or key (with a "did you mean"), a wrong type or
an out-of-range value is a :class:`ConfigError`, because a typo that silently falls back
to a default is worse than a daemon that refuses to start.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .schema import ALL_KEYS, SECTIONS, Config, ConfigError, section_fields
from .validate import build_section, cross_check


def _suggest(name: str, options: list[str]) -> str:
    close = difflib.get_close_matches(name, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _layer(merged: dict[str, dict[str, tuple[Any, str]]], data: Mapping[str, Any],
           source: str) -> None:
    """Merge one source's ``{section: {key: value}}`` into ``merged`` as (value, source),
    rejecting unknown sections and keys."""
    for section, table in data.items():
        if section not in SECTIONS:
            raise ConfigError(f"{source}: unknown section [{section}]"
                              f"{_suggest(section, list(SECTIONS))}; sections are "
                              f"{', '.join(SECTIONS)}", key=section)
        if not isinstance(table, Mapping):
            raise ConfigError(f"{source}: {section} must be a table ([{section}]), got "
                              f"{table!r}", key=section, value=table)
        names = list(section_fields(section))
        for name, value in table.items():
            if name not in names:
                raise ConfigError(f"{source}: unknown key {section}.{name}"
                                  f"{_suggest(name, names)}; [{section}] keys are "
                                  f"{', '.join(names)}", key=f"{section}.{name}")
            merged.setdefault(section, {})[name] = (value, source)


def _nest_overrides(overrides: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """{"daemon.socket": x, "lr": y} -> {"daemon": {"socket": x}, "train": {"lr": y}};
    a bare key must be unique across sections; None values (flags not given) are skipped."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        if "." in key:
            section, _, name = key.partition(".")
        else:
            homes = [s for s in SECTIONS if key in section_fields(s)]
            if len(homes) != 1:
                raise ConfigError(f"override {key!r}: " + (
                    "no such key" + _suggest(key, [k.split(".")[1] for k in ALL_KEYS])
                    if not homes else f"ambiguous, write one of "
                                      f"{', '.join(f'{s}.{key}' for s in homes)}"), key=key)
            section, name = homes[0], key
        out.setdefault(section, {})[name] = value
    return out


def default_config(env: Mapping[str, str] | None = None) -> Config:
    """The defaults, with ``$STATE_DIRECTORY`` (set by systemd's StateDirectory=) as the
    state directory when present (the first entry if it lists several)."""
    env = os.environ if env is None else env
    state = env.get("STATE_DIRECTORY", "").split(":")[0]
    cfg = Config()
    if state:
        cfg = dataclasses.replace(cfg, daemon=dataclasses.replace(cfg.daemon, state_dir=state))
    return cfg


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    """Parse a TOML file; a missing or unreadable file or a syntax error is a ConfigError."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError as e:
        raise ConfigError(f"config file {p} does not exist (copy gated.example.toml there, "
                          "or leave out --config to run on the defaults)") from e
    except OSError as e:
        raise ConfigError(f"cannot read config file {p}: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from e


def load_config(path: str | os.PathLike | None = None,
                overrides: Mapping[str, Any] | None = None, *,
                env: Mapping[str, str] | None = None) -> Config:
    """Defaults (and ``$STATE_DIRECTORY``) < the TOML file at ``path`` < ``overrides``.

    ``overrides`` maps "section.key" (or a key that exists in one section only) to a value;
    None values are skipped, so ``cli_overrides(args)`` can be passed as it is. Raises
    :class:`ConfigError` on anything invalid.
    """
    base = default_config(env)
    merged: dict[str, dict[str, tuple[Any, str]]] = {}
    if path is not None:
        _layer(merged, read_toml(path), str(path))
    if overrides:
        _layer(merged, _nest_overrides(overrides), "command line")
    sections = {}
    for sec in SECTIONS:
        values = dataclasses.asdict(getattr(base, sec))
        given = merged.get(sec, {})
        values.update({k: v for k, (v, _) in given.items()})
        sections[sec] = build_section(sec, values, {k: src for k, (_, src) in given.items()})
    cfg = Config(**sections)
    cross_check(cfg, str(path) if path is not None else "command line")
    return cfg


def cli_overrides(args: Any) -> dict[str, Any]:
    """The overrides of ``gated run``'s flags (argparse namespace; unset flags are None)."""
    return {f"daemon.{k}": getattr(args, k, None)
            for k in ("state_dir", "socket", "metrics_addr", "device", "preset")}
