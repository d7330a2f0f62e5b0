"""Configuration: defaults < TOML file < command-line flags, strict validation, hot reload.

Every key is documented in ``gated.example.toml`` (and its meaning, default and whether it
reloads live in the field metadata below, which that file and the tests are checked
against). Validation is strict: an unknown key, a wrong type or an out-of-range value is
a :class:`ConfigError` naming the key, the value and what is allowed, because a typo that
silently falls back to a default is worse than a daemon that refuses to start.

Hot reload (file change through :class:`ConfigWatcher`, or SIGHUP): :class:`Reloader`
re-reads the file, re-applies the same command-line flags, and applies only the keys in
:data:`SAFE_KEYS` (learning rate, loss weights, swap policy, batch size, replay mix,
thresholds and bands, signal weights, log level, retention). Keys that need a restart are
refused with a log line and keep their running values; an invalid file changes nothing
and the last good config stays.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import logging
import math
import os
import threading
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from watchdog.events import FileSystemEventHandler

from . import systemd
from .metrics import parse_hostport
from .protocol import Limits

log = logging.getLogger("gated.config")

DEFAULT_STATE_DIR = "./var/gated"
DEFAULT_SOCKET = "./var/gated.sock"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_SUN_PATH_MAX = 107  # bytes of a Unix socket path (sun_path is 108 with the NUL)


class ConfigError(ValueError):
    """An invalid configuration; the message says which key, what value, what is allowed."""

    def __init__(self, message: str, *, key: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.key, self.value = key, value


def _opt(default: Any, doc: str, *, hot: bool = False, lo: float | None = None,
         hi: float | None = None, lo_open: bool = False, hi_open: bool = False,
         choices: tuple[str, ...] | None = None,
         check: Callable[[Any], str | None] | None = None) -> Any:
    """A config field: default, one-line doc, hot-reloadable or not, allowed values.

    ``check(value)`` returns an error text (or None) for rules a range cannot express.
    """
    return field(default=default, metadata={
        "doc": doc, "hot": hot, "lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open,
        "choices": choices, "check": check})


def _check_addr(v: str) -> str | None:
    if v == "":
        return None  # metrics disabled
    try:
        parse_hostport(v)
    except ValueError as e:
        return str(e)
    return None


def _check_socket(v: str) -> str | None:
    if not v:
        return "must not be empty"
    n = len(os.fsencode(v))
    if n > _SUN_PATH_MAX:
        return (f"is {n} bytes; a Unix socket path is at most {_SUN_PATH_MAX} bytes: use a "
                "shorter path")
    return None


def _nonempty(v: str) -> str | None:
    return None if v else "must not be empty"


@dataclass(frozen=True)
class DaemonConfig:
    state_dir: str = _opt(DEFAULT_STATE_DIR, "LMDB state directory (under systemd: "
                          "$STATE_DIRECTORY)", check=_nonempty)
    socket: str = _opt(DEFAULT_SOCKET, "Unix socket path (ignored under socket activation)",
                       check=_check_socket)
    metrics_addr: str = _opt("127.0.0.1:9464", "Prometheus endpoint HOST:PORT; \"\" "
                             "disables it", check=_check_addr)
    device: str = _opt("auto", "compute device", choices=("auto", "cpu", "cuda"))
    preset: str = _opt("flint", "model preset", choices=("tiny", "flint"))
    log_level: str = _opt("INFO", "log level", hot=True, choices=LOG_LEVELS)
    seed: int = _opt(0, "seed of weight init and replay sampling", lo=0)


@dataclass(frozen=True)
class TrainConfig:
    lr: float = _opt(1e-3, "AdamW learning rate", hot=True, lo=0.0, lo_open=True, hi=1.0)
    lambda_bce: float = _opt(1.0, "weight of the gate BCE loss", hot=True, lo=0.0)
    lambda_ce: float = _opt(0.5, "weight of the reason cross-entropy loss", hot=True, lo=0.0)
    lambda_ewc: float = _opt(0.0, "online EWC strength; 0 = off", hot=True, lo=0.0)
    ewc_decay: float = _opt(0.99, "decay of the EWC Fisher running mean", lo=0.0,
                            lo_open=True, hi=1.0, hi_open=True)
    weight_decay: float = _opt(0.01, "AdamW decoupled weight decay", hot=True, lo=0.0,
                               hi=1.0, hi_open=True)
    clip_norm: float = _opt(1.0, "global gradient-norm clip; 0 = off", hot=True, lo=0.0)
    warmup_steps: int = _opt(0, "linear LR warmup steps; 0 = none", lo=0)
    cosine_steps: int = _opt(0, "cosine LR decay steps after warmup; 0 = constant LR",
                             lo=0)
    batch_size: int = _opt(16, "examples per training step (fresh + replayed)", hot=True,
                           lo=1, hi=4096)
    replay_fraction: float = _opt(0.5, "share of each batch drawn from the replay "
                                  "reservoir", hot=True, lo=0.0, hi=1.0, hi_open=True)
    replay_slots: int = _opt(10000, "replay reservoir size", lo=1, hi=10_000_000)
    idle_steps_per_second: float = _opt(1.0, "replay-only steps per second when no fresh "
                                        "signals wait; 0 = none", hot=True, lo=0.0,
                                        hi=1000.0)
    swap_every_steps: int = _opt(10, "publish trained weights every N steps", hot=True,
                                 lo=1)
    swap_every_seconds: float = _opt(1.0, "...or every T seconds with new steps", hot=True,
                                     lo=0.0, lo_open=True)
    checkpoint_every_steps: int = _opt(50, "commit a checkpoint every N steps", hot=True,
                                       lo=1)
    alignment_window: int = _opt(1000, "signals in the progressive-validation window",
                                 lo=1, hi=1_000_000)
    converged_threshold: float = _opt(0.95, "alignment at which the model counts as "
                                      "converged", hot=True, lo=0.0, lo_open=True, hi=1.0)
    fresh_per_step: int = _opt(256, "fresh signals read and scored per step at most; the "
                               "hardest of them are trained on (selective backprop)",
                               hot=True, lo=1, hi=4096)
    selective_confidence: float = _opt(0.9, "a fresh signal whose label the serving model "
                                       "already gives this calibrated probability is not "
                                       "back-propagated (unless sampled); 1 = train on all",
                                       hot=True, lo=0.5, hi=1.0)
    selective_keep: float = _opt(0.1, "share of the confidently right fresh signals still "
                                 "trained on", hot=True, lo=0.0, hi=1.0)
    step_chunk_rows: int = _opt(8, "a training batch is processed in length-sorted chunks of "
                                "this many rows, each padded to its own longest source (same "
                                "loss and gradient, less padding); 0 = one piece", hot=True,
                                lo=0, hi=4096)
    wide_lr: float = _opt(0.5, "AdaGrad learning rate of the wide (hashed n-gram) path, "
                          "which learns from every fresh signal", hot=True, lo=0.0, hi=100.0)
    wide_l2: float = _opt(1e-5, "L2 penalty of the wide path's weights", hot=True, lo=0.0)
    drift_wide_relax: float = _opt(1.0, "after a detected drift the wide path's AdaGrad "
                                   "squared-gradient sums are multiplied by this (0 = its "
                                   "steps as large as at the start; 1 = unchanged, measured "
                                   "better on unseen values)", hot=True, lo=0.0, hi=1.0)
    drift_threshold: float = _opt(12.0, "Page-Hinkley alarm threshold on the progressive "
                                  "error stream; lower = faster, more false alarms",
                                  lo=0.0, lo_open=True)
    drift_delta: float = _opt(0.01, "Page-Hinkley tolerance: error-rate rises below this "
                              "are ignored", lo=0.0)
    drift_adapt_signals: int = _opt(1000, "signals after a detected drift during which EWC "
                                    "is off and replay is reduced", hot=True, lo=0)
    drift_replay_fraction: float = _opt(0.1, "replay share of a batch while adapting to a "
                                        "drift", hot=True, lo=0.0, hi=1.0, hi_open=True)


def _check_fp_fn(v: tuple[float, ...]) -> str | None:
    if list(v) != sorted(v):
        return "must not decrease (weights for the 1st, 2nd, 3rd+ report of a context)"
    return None


@dataclass(frozen=True)
class WeightsConfig:
    confirm: float = _opt(1.0, "weight of a plain or confirmed decision", hot=True, lo=0.0,
                          lo_open=True, hi=100.0)
    override: float = _opt(2.0, "weight of override_allow / override_block", hot=True,
                           lo=0.0, lo_open=True, hi=100.0)
    fp_fn: tuple[float, ...] = _opt((4.0, 6.0, 8.0), "weights of false_positive / "
                                    "false_negative reports, by repeat", hot=True, lo=0.0,
                                    lo_open=True, hi=100.0, check=_check_fp_fn)


@dataclass(frozen=True)
class BandsConfig:
    allow: float = _opt(0.9, "p_allow at or above which the band is allow", hot=True,
                        lo=0.0, hi=1.0)
    block: float = _opt(0.1, "p_allow at or below which the band is block", hot=True,
                        lo=0.0, hi=1.0)


@dataclass(frozen=True)
class RetentionConfig:
    max_age_s: float = _opt(30 * 86400.0, "prune trained signals older than this; 0 = "
                            "keep forever", hot=True, lo=0.0)
    max_count: int = _opt(5_000_000, "keep at most this many signals; 0 = no limit",
                          hot=True, lo=0)


@dataclass(frozen=True)
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    weights: WeightsConfig = field(default_factory=WeightsConfig)
    bands: BandsConfig = field(default_factory=BandsConfig)
    limits: Limits = field(default_factory=Limits)
    retention: RetentionConfig = field(default_factory=RetentionConfig)

    def get(self, key: str) -> Any:
        """``cfg.get("train.lr")``."""
        section, _, name = key.partition(".")
        return getattr(getattr(self, section), name)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Nested plain dict (for ``status`` and logs); tuples become lists."""
        out: dict[str, dict[str, Any]] = {}
        for sec in SECTIONS:
            out[sec] = {k: list(v) if isinstance(v, tuple) else v
                        for k, v in dataclasses.asdict(getattr(self, sec)).items()}
        return out


SECTIONS: dict[str, type] = {"daemon": DaemonConfig, "train": TrainConfig,
                             "weights": WeightsConfig, "bands": BandsConfig,
                             "limits": Limits, "retention": RetentionConfig}


def _fields(section: str) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(SECTIONS[section])}


#: Every key, as "section.key".
ALL_KEYS: tuple[str, ...] = tuple(f"{s}.{n}" for s in SECTIONS for n in _fields(s))

#: Keys a reload applies to the running daemon; every other key needs a restart.
SAFE_KEYS: frozenset[str] = frozenset(
    f"{s}.{n}" for s in SECTIONS for n, f in _fields(s).items() if f.metadata.get("hot"))


def key_doc(key: str) -> str:
    """The one-line meaning of a key (from the field metadata; limits from Limits)."""
    section, _, name = key.partition(".")
    return _fields(section)[name].metadata.get("doc", "protocol limit (see docs/protocol.md)")


# --- validation -----------------------------------------------------------------------

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


def _build_section(section: str, values: Mapping[str, Any],
                   sources: Mapping[str, str]) -> Any:
    """The section's dataclass from ``values`` (checked); ``sources`` names where each
    value came from, for error messages."""
    cls = SECTIONS[section]
    kwargs = {}
    for name, f in _fields(section).items():
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


def _cross_check(cfg: Config, source: str) -> None:
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
        names = list(_fields(section))
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
            homes = [s for s in SECTIONS if key in _fields(s)]
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
        sections[sec] = _build_section(sec, values, {k: src for k, (_, src) in given.items()})
    cfg = Config(**sections)
    _cross_check(cfg, str(path) if path is not None else "command line")
    return cfg


def cli_overrides(args: Any) -> dict[str, Any]:
    """The overrides of ``gated run``'s flags (argparse namespace; unset flags are None)."""
    return {f"daemon.{k}": getattr(args, k, None)
            for k in ("state_dir", "socket", "metrics_addr", "device", "preset")}


# --- reload ---------------------------------------------------------------------------

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
        for name in _fields(sec):
            if getattr(o, name) != getattr(n, name):
                key = f"{sec}.{name}"
                if key in SAFE_KEYS:
                    changes[name] = getattr(n, name)
                    applied_keys.append(key)
                else:
                    refused_keys.append(key)
        sections[sec] = dataclasses.replace(o, **changes) if changes else o
    return Config(**sections), applied_keys, refused_keys


@dataclass
class ReloadResult:
    """The outcome of one reload: ``config`` is what is in force afterwards."""

    ok: bool
    config: Config
    applied_keys: list[str] = field(default_factory=list)
    refused_keys: list[str] = field(default_factory=list)
    error: str | None = None


class Reloader:
    """Re-reads the config on demand and applies the safe changes; thread-safe.

    ``apply(config, applied_keys)`` is called (from the caller's thread: the watcher's, or
    the one handling SIGHUP) with the new config when some safe key changed; it must make
    the running daemon use it. If it raises, the reload counts as failed and the previous
    config stays current. ``metrics`` (optional) gets ``config_reload(ok)``. With
    ``notify`` the reload is bracketed by RELOADING=1 ... READY=1 for systemd, so start
    the watcher and the SIGHUP handler only after the daemon has sent its first READY.
    """

    def __init__(self, path: str | os.PathLike | None, overrides: Mapping[str, Any] | None,
                 current: Config, apply: Callable[[Config, list[str]], None], *,
                 metrics: Any = None, notify: bool = True,
                 env: Mapping[str, str] | None = None) -> None:
        self.path = None if path is None else Path(path)
        self.overrides = dict(overrides or {})
        self._current = current
        self._apply = apply
        self._metrics = metrics
        self._notify = notify
        self._env = env
        self._lock = threading.Lock()
        self.loaded_at = time.time()

    @property
    def current(self) -> Config:
        return self._current

    def reload(self, source: str = "SIGHUP") -> ReloadResult:
        with self._lock:
            if self._notify:
                systemd.reloading()
            try:
                return self._reload(source)
            finally:
                if self._notify:
                    systemd.ready()

    def _reload(self, source: str) -> ReloadResult:
        where = f"config reload ({source})" + (f" from {self.path}" if self.path else "")
        old = self._current
        try:
            new = load_config(self.path, self.overrides, env=self._env)
        except ConfigError as e:
            return self._failed(where, str(e))
        applied, applied_keys, refused_keys = diff_reload(old, new)
        if refused_keys:
            log.warning("%s: not applied, these keys need a restart: %s; the running values "
                        "stay until `systemctl restart gated`", where,
                        ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}"
                                  for k in refused_keys))
        if applied_keys:
            try:
                self._apply(applied, applied_keys)
            except Exception as e:  # noqa: BLE001 - the daemon must survive a bad apply
                log.exception("%s: applying %s failed", where, ", ".join(applied_keys))
                return self._failed(where, f"applying the new values failed: {e}")
            log.info("%s: applied %s", where, ", ".join(
                f"{k} {old.get(k)!r} -> {applied.get(k)!r}" for k in applied_keys))
        elif not refused_keys:
            log.info("%s: no changes", where)
        self._current = applied
        self.loaded_at = time.time()
        if self._metrics is not None:
            self._metrics.config_reload(True)
        return ReloadResult(True, applied, applied_keys, refused_keys)

    def _failed(self, where: str, error: str) -> ReloadResult:
        log.error("%s failed: %s; keeping the last good config (loaded %s). Fix the file "
                  "and save it again, or send SIGHUP.", where, error,
                  time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.loaded_at)))
        if self._metrics is not None:
            self._metrics.config_reload(False)
        return ReloadResult(False, self._current, error=error)


class ConfigWatcher:
    """Calls ``on_change()`` once the config file has changed and settled.

    It watches the file's DIRECTORY (editors and config managers replace a file by
    writing a temporary one and renaming it over the original, which a watch on the file
    itself would lose) and keeps events that name the file: modified, closed after
    writing, created, or moved onto it. Events are debounced: the callback runs once
    ``debounce`` seconds after the last event, from the watcher's own thread, and only if
    the file's bytes differ from the last time (so a save that changes nothing, or
    several events of one save, reload once). If the file is a symlink, changes to its
    target elsewhere are not seen: send SIGHUP.
    """

    _EVENTS = frozenset({"modified", "closed", "created", "moved"})

    def __init__(self, path: str | os.PathLike, on_change: Callable[[], None], *,
                 debounce: float = 0.2) -> None:
        from watchdog.observers import Observer

        self.path = Path(path).absolute()
        self.on_change = on_change
        self.debounce = debounce
        self._digest = self._read_digest()
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._stopping = False
        self._observer = Observer()
        self._observer.daemon = True
        self._observer.schedule(_Handler(self), str(self.path.parent), recursive=False)
        self._worker = threading.Thread(target=self._run, name="gated-config-watch",
                                        daemon=True)
        self._started = False

    def start(self) -> ConfigWatcher:
        self._observer.start()
        self._worker.start()
        self._started = True
        log.info("watching %s for changes", self.path)
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._started:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._worker.join(timeout=5)

    def __enter__(self) -> ConfigWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _read_digest(self) -> bytes | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).digest()
        except OSError:
            return None

    def _event(self, event: Any) -> None:
        if event.is_directory or event.event_type not in self._EVENTS:
            return
        names = [event.src_path]
        if event.event_type == "moved":
            names = [event.dest_path]
        if not any(Path(os.fsdecode(n)).absolute() == self.path for n in names):
            return
        with self._cond:
            self._deadline = time.monotonic() + self.debounce
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (
                        self._deadline is None or time.monotonic() < self._deadline):
                    timeout = None if self._deadline is None else \
                        max(0.0, self._deadline - time.monotonic())
                    self._cond.wait(timeout)
                if self._stopping:
                    return
                self._deadline = None
            digest = self._read_digest()
            if digest is None or digest == self._digest:
                continue  # gone for now (a new file will follow), or unchanged
            self._digest = digest
            try:
                self.on_change()
            except Exception:  # noqa: BLE001 - keep watching whatever the callback does
                log.exception("config change handler failed; still watching %s", self.path)


class _Handler(FileSystemEventHandler):
    """Forwards every watchdog event of the directory to the watcher's filter."""

    def __init__(self, watcher: ConfigWatcher) -> None:
        super().__init__()
        self.watcher = watcher

    def dispatch(self, event: Any) -> None:
        self.watcher._event(event)
