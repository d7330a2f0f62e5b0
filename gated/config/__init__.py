"""Configuration: defaults < TOML file < command-line flags, strict validation.

Every key is documented in ``gated.example.toml``; its meaning, default and whether it
reloads live are the field metadata in :mod:`gated.config.schema`, which that file and
the tests are checked against. Validation is strict: an unknown key, a wrong type or an
out-of-range value is a :class:`ConfigError` naming the key, the value and what is
allowed.

Modules, by concern:

* :mod:`~gated.config.schema`: the sections (dataclasses), their keys, defaults, docs,
  and which keys are hot (:data:`SAFE_KEYS`);
* :mod:`~gated.config.train`: :class:`TrainConfig`, the ``[train]`` section (the learning
  defaults);
* :mod:`~gated.config.fields`: ``_opt``, how a key is declared (default, doc, hot, range);
* :mod:`~gated.config.limits`: :class:`Limits`, the ``[limits]`` section, shared by the
  wire protocol and the signal validator;
* :mod:`~gated.config.addresses`: ``HOST:PORT`` and Unix socket path checks;
* :mod:`~gated.config.validate`: type, range and cross-key checks;
* :mod:`~gated.config.load`: reading the TOML file, layering the sources, ``load_config``;
* :mod:`~gated.config.diff`: the reload policy (:func:`diff_reload`).

This package imports nothing of the daemon (nor of the protocol, the store or the
engine). Applying a reload to a running daemon (file watching, SIGHUP, systemd
notifications) is :mod:`gated.daemon.reload`.
"""

from .addresses import SUN_PATH_MAX, parse_hostport
from .diff import diff_reload
from .limits import KIB, MIB, Limits
from .load import cli_overrides, default_config, load_config, read_toml
from .schema import (
    ALL_KEYS,
    DEFAULT_SOCKET,
    DEFAULT_STATE_DIR,
    LOG_LEVELS,
    SAFE_KEYS,
    SECTIONS,
    AccessConfig,
    AuditConfig,
    BandsConfig,
    Config,
    ConfigError,
    DaemonConfig,
    OverridesConfig,
    RetentionConfig,
    RulesConfig,
    ServingConfig,
    TrainConfig,
    WeightsConfig,
    key_doc,
)

__all__ = [
    "ALL_KEYS", "DEFAULT_SOCKET", "DEFAULT_STATE_DIR", "KIB", "LOG_LEVELS", "MIB",
    "SAFE_KEYS", "SECTIONS", "SUN_PATH_MAX", "AccessConfig",
    "AuditConfig", "BandsConfig", "Config", "ConfigError",
    "DaemonConfig", "Limits", "OverridesConfig", "RetentionConfig", "RulesConfig",
    "ServingConfig", "TrainConfig", "WeightsConfig",
    "cli_overrides", "default_config", "diff_reload", "key_doc", "load_config",
    "parse_hostport", "read_toml",
]
