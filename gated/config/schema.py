"""What the config is: its sections and keys, their defaults, meaning and reload policy.

Every key is a field of a frozen dataclass; its metadata (through
:func:`gated.config.fields._opt`) holds the one-line doc, whether it reloads live
(``hot``), and the allowed values (range, choices, or a ``check``), which
gated/config/validate.py enforces and ``gated.example.toml`` and the tests are checked
against. The ``[limits]`` section is :class:`Limits`
(gated/config/limits.py), whose fields carry no metadata: each must be a positive
integer and the class cross-checks them itself. The ``[train]`` section, most of the keys,
is :class:`TrainConfig` (gated/config/train.py).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .addresses import SUN_PATH_MAX, parse_hostport
from .fields import _opt
from .limits import Limits
from .train import TrainConfig

DEFAULT_STATE_DIR = "./var/gated"
DEFAULT_SOCKET = "./var/gated.sock"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class ConfigError(ValueError):
    """An invalid configuration; the message says which key, what value, what is allowed."""

    def __init__(self, message: str, *, key: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.key, self.value = key, value


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
    if n > SUN_PATH_MAX:
        return (f"is {n} bytes; a Unix socket path is at most {SUN_PATH_MAX} bytes: use a "
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
    trainer_threads: int = _opt(0, "BLAS threads of the trainer process; 0 = the cores "
                                "serving does not use (at least 1)", lo=0, hi=1024)
    trainer_nice: int = _opt(10, "niceness the trainer process adds to itself, so that on "
                             "a busy host predictions preempt training; 0 = same priority",
                             lo=0, hi=19)
    disk_free_min_mib: int = _opt(64, "refuse to start when the filesystem holding the "
                                  "state dir has less than this many MiB free; 0 = no check "
                                  "(a full disk is still refused cleanly at open)", lo=0,
                                  hi=1 << 30)
    disk_free_warn_mib: int = _opt(1024, "while running, warn (log line, gated_disk_low) "
                                   "when the state dir's filesystem has less than this many "
                                   "MiB free; 0 = never", hot=True, lo=0, hi=1 << 30)
    stop_timeout_s: float = _opt(4.0, "SIGTERM: how long the requests already read may take "
                                 "to be answered, then how long the trainer process may take "
                                 "to checkpoint and exit before it is killed (acknowledged "
                                 "signals are durable either way)", lo=0.1, hi=60.0)


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
class ServingConfig:
    threads: int = _opt(1, "BLAS threads of the predict path (one row: more threads only "
                        "contend)", lo=1, hi=1024)
    cache_size: int = _opt(4096, "exact prediction cache entries, keyed by (weights "
                           "version, context, history); 0 = off", lo=0, hi=10_000_000)
    batch_wait_ms: float = _opt(0.0, "how long a predict waits for others to share its "
                                "forward pass (requests that queue during a forward are "
                                "batched anyway)", lo=0.0, hi=1000.0)
    batch_max: int = _opt(32, "most predicts in one forward pass", lo=1, hi=4096)
    served_logits: int = _opt(8192, "calls whose served transformer logit is remembered "
                              "(small keys) so that their signal carries it and the "
                              "trainer does not compute it again; 0 = off", lo=0,
                              hi=10_000_000)


def _ids(doc: str) -> Any:
    """A hot key holding user or group ids (integers) or names (strings); may be empty
    (gated/config/validate.py checks the items)."""
    return field(default=(), metadata={"doc": doc, "hot": True, "ids": True})


@dataclass(frozen=True)
class AccessConfig:
    """Who may use which ops, by the client's SO_PEERCRED uid and groups (docs/operations.md,
    "Security model"). A class of ops whose two lists are both empty is open to every
    client that can connect (the socket's mode and group decide); otherwise a client may
    use them when its uid is in the uids list or its primary or a supplementary group is in
    the gids list. `ping` is open to every client."""

    signal_uids: tuple = _ids("users (uid or name) that may use the ops that change the "
                              "model: signal, signals, rollback, resume")
    signal_gids: tuple = _ids("groups (gid or name) whose members may use signal, signals, "
                              "rollback and resume")
    predict_uids: tuple = _ids("users (uid or name) that may ask predict, explain and "
                               "status")
    predict_gids: tuple = _ids("groups (gid or name) whose members may ask predict, "
                               "explain and status")


def _check_names(v: tuple[str, ...]) -> str | None:
    for i, name in enumerate(v):
        if not name.strip():
            return f"entry {i} is empty or blank (it would match every call)"
    return None


def _check_regexes(v: tuple[str, ...]) -> str | None:
    why = _check_names(v)
    if why:
        return why
    for pattern in v:
        try:
            re.compile(pattern)
        except re.error as e:
            return f"holds an invalid regular expression {pattern!r}: {e}"
    return None


def _rules(doc: str, check: Callable[[Any], str | None] = _check_names) -> Any:
    return _opt((), doc, hot=True, items="str", check=check)


@dataclass(frozen=True)
class RulesConfig:
    """Operator allow/deny rules, checked before the override memory and the model
    (gated/rules.py); deny wins over allow."""

    allow_tools: tuple[str, ...] = _rules("tool names (the context's leading word) always "
                                          "allowed")
    deny_tools: tuple[str, ...] = _rules("tool names always blocked")
    allow_prefixes: tuple[str, ...] = _rules("context prefixes (whitespace-normalised) "
                                             "always allowed")
    deny_prefixes: tuple[str, ...] = _rules("context prefixes always blocked")
    allow_regex: tuple[str, ...] = _rules("regular expressions (re.search on the context) "
                                          "always allowed", _check_regexes)
    deny_regex: tuple[str, ...] = _rules("regular expressions always blocked",
                                         _check_regexes)


@dataclass(frozen=True)
class OverridesConfig:
    max_entries: int = _opt(10_000, "corrections remembered at most (the oldest is dropped "
                            "first); 0 = no override memory", hot=True, lo=0,
                            hi=10_000_000)
    ttl_s: float = _opt(7 * 86400.0, "an override expires this many seconds after its "
                        "correction", hot=True, lo=0.0, lo_open=True)
    agree_margin: float = _opt(0.4, "an override expires once the model agrees with it by "
                               "this margin: p_allow >= 0.5 + margin for allow, <= 0.5 - "
                               "margin for block", hot=True, lo=0.0, hi=0.5)


@dataclass(frozen=True)
class AuditConfig:
    max_entries: int = _opt(1_000_000, "audit records kept at most (the oldest are pruned "
                            "first); 0 = keep none", hot=True, lo=0)
    max_age_s: float = _opt(7 * 86400.0, "audit records older than this are pruned; 0 = no "
                            "age limit", hot=True, lo=0.0)
    queue_max: int = _opt(65536, "audit records waiting for the background writer at most; "
                          "beyond, new ones are dropped (counted, logged)", lo=1,
                          hi=10_000_000)
    alignment_window: int = _opt(1000, "signals referencing a served prediction in the "
                                 "served-alignment window", lo=1, hi=1_000_000)


@dataclass(frozen=True)
class ClusterConfig:
    """Many hosts (docs/cluster.md): edges on the gateway hosts, one trainer, NATS
    JetStream between them. `role = "single"` (the default) uses none of it."""

    role: str = _opt("single", "single (one host, LMDB only), edge (gateway host: signals "
                     "to JetStream, predictions from the published snapshot) or trainer",
                     choices=("single", "edge", "trainer"))
    servers: str = _opt("nats://127.0.0.1:4222", "NATS server URLs, comma-separated",
                        check=_nonempty)
    name: str = _opt("", "this node's name (NATS client name, prefix of the ids an edge "
                     "gives signals sent without one); \"\" = the host name")
    stream: str = _opt("GATED_SIGNALS", "JetStream stream of the signals", check=_nonempty)
    subject: str = _opt("gated.signals", "subject the edges publish signals on",
                        check=_nonempty)
    consumer: str = _opt("gated-trainer", "the trainer's durable pull consumer",
                         check=_nonempty)
    kv_bucket: str = _opt("gated_model", "KV bucket holding the current version (key "
                          "\"current\")", check=_nonempty)
    object_bucket: str = _opt("gated_snapshots", "Object Store bucket of the published "
                              "snapshots", check=_nonempty)
    replicas: int = _opt(1, "replicas of the stream and buckets (3 on a NATS cluster)",
                         lo=1, hi=5)
    duplicate_window_s: float = _opt(600.0, "JetStream de-duplication window of signal "
                                     "ids (Nats-Msg-Id)", lo=1.0, hi=86400.0)
    publish_timeout_s: float = _opt(2.0, "an edge answers overloaded when JetStream has "
                                    "not acknowledged a signal within this time", lo=0.05,
                                    hi=60.0)
    fetch_batch: int = _opt(1024, "messages the trainer pulls per fetch", lo=1, hi=65536)
    ack_wait_s: float = _opt(30.0, "JetStream redelivers a message the trainer has not acked "
                             "(after its LMDB commit) within this time", lo=1.0, hi=3600.0)
    keep_snapshots: int = _opt(3, "snapshot objects kept in the Object Store", lo=1,
                               hi=1000)
    poll_s: float = _opt(2.0, "an edge also polls the current version this often (beside "
                         "its KV watch)", lo=0.1, hi=3600.0)


@dataclass(frozen=True)
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    weights: WeightsConfig = field(default_factory=WeightsConfig)
    bands: BandsConfig = field(default_factory=BandsConfig)
    limits: Limits = field(default_factory=Limits)
    access: AccessConfig = field(default_factory=AccessConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    serving: ServingConfig = field(default_factory=ServingConfig)
    rules: RulesConfig = field(default_factory=RulesConfig)
    overrides: OverridesConfig = field(default_factory=OverridesConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

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
                             "limits": Limits, "access": AccessConfig,
                             "retention": RetentionConfig,
                             "serving": ServingConfig, "rules": RulesConfig,
                             "overrides": OverridesConfig, "audit": AuditConfig,
                             "cluster": ClusterConfig}


def section_fields(section: str) -> dict[str, dataclasses.Field]:
    """``{name: dataclasses.Field}`` of a section, in declaration order."""
    return {f.name: f for f in dataclasses.fields(SECTIONS[section])}


#: Every key, as "section.key".
ALL_KEYS: tuple[str, ...] = tuple(f"{s}.{n}" for s in SECTIONS for n in section_fields(s))

#: Keys a reload applies to the running daemon; every other key needs a restart.
SAFE_KEYS: frozenset[str] = frozenset(
    f"{s}.{n}" for s in SECTIONS for n, f in section_fields(s).items() if f.metadata.get("hot"))


def key_doc(key: str) -> str:
    """The one-line meaning of a key (from the field metadata; limits from Limits)."""
    section, _, name = key.partition(".")
    return section_fields(section)[name].metadata.get(
        "doc", "protocol limit (see docs/protocol.md)")
