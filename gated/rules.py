"""Operator rules: allow and deny patterns that answer a prediction before the model does.

The ``[rules]`` section of the config (docs/operations.md, "Trust") lists exact tool names,
context prefixes and regular expressions, each as an allow or a deny list. A prediction
checks them first, before the override memory and the model: a deny that matches answers
``block`` (p_allow 0.0), else an allow that matches answers ``allow`` (p_allow 1.0), else
the rules say nothing. Deny wins over allow whatever the order in the file.

- ``*_tools``: the tool name, the context's leading word (up to the first whitespace), is
  equal to an entry: ``shell.exec`` matches ``shell.exec {"cmd": "ls"}``.
- ``*_prefixes``: the context, with runs of whitespace collapsed to one space and leading
  whitespace dropped, starts with the entry (whitespace in the entry collapsed the same
  way), so a deny prefix is not dodged by an extra space.
- ``*_regex``: Python ``re.search`` anywhere in the context as sent.

Rules look at the call being judged, never at the history. A rule answers a prediction
only: it writes nothing to the signal log, so it never trains the model by itself.

Pure: no I/O, no threads; the daemon builds a new :class:`RuleSet` on each config reload
and swaps it in by one reference assignment.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

ALLOW, DENY = "allow", "deny"
#: The config keys of [rules], in the order they are checked (deny lists first).
RULE_KEYS = ("deny_tools", "deny_prefixes", "deny_regex",
             "allow_tools", "allow_prefixes", "allow_regex")

_WS = re.compile(r"\s+")
_TOOL = re.compile(r"\s*(\S*)")


def tool_of(context: str) -> str:
    """The tool name of a call: its leading word, up to the first whitespace ("" if blank).
    Reads only that far (a context may be 64 KiB)."""
    m = _TOOL.match(context)
    return m.group(1) if m else ""


def _norm_prefix(text: str) -> str:
    return _WS.sub(" ", text).lstrip()


@dataclass(frozen=True)
class RuleMatch:
    """What a rule decided: ``action`` (allow | deny) and ``rule`` (``key:pattern``)."""

    action: str
    rule: str

    @property
    def p_allow(self) -> float:
        return 1.0 if self.action == ALLOW else 0.0

    @property
    def band(self) -> str:
        return "allow" if self.action == ALLOW else "block"


class RuleSet:
    """The compiled ``[rules]``; ``match(context)`` -> :class:`RuleMatch` or None."""

    def __init__(self, *, allow_tools: Iterable[str] = (), deny_tools: Iterable[str] = (),
                 allow_prefixes: Iterable[str] = (), deny_prefixes: Iterable[str] = (),
                 allow_regex: Iterable[str] = (), deny_regex: Iterable[str] = ()) -> None:
        self.tools = {DENY: frozenset(deny_tools), ALLOW: frozenset(allow_tools)}
        self.prefixes = {DENY: tuple((p, _norm_prefix(p)) for p in deny_prefixes),
                         ALLOW: tuple((p, _norm_prefix(p)) for p in allow_prefixes)}
        self.regex = {DENY: tuple((p, compile_rule(p, "rules.deny_regex")) for p in deny_regex),
                      ALLOW: tuple((p, compile_rule(p, "rules.allow_regex"))
                                   for p in allow_regex)}
        self.count = sum(len(v) for d in (self.tools, self.prefixes, self.regex)
                         for v in d.values())

    @classmethod
    def from_config(cls, rules: Any) -> RuleSet:
        """From the config's ``[rules]`` section (gated.config.RulesConfig)."""
        return cls(**{k: getattr(rules, k) for k in RULE_KEYS})

    def __len__(self) -> int:
        return self.count

    def match(self, context: str) -> RuleMatch | None:
        if not self.count:
            return None
        tool = tool_of(context)
        norm: str | None = None
        for action in (DENY, ALLOW):
            if tool in self.tools[action]:
                return RuleMatch(action, f"{action}_tools:{tool}")
            if self.prefixes[action]:
                if norm is None:
                    norm = _norm_prefix(context)
                for raw, p in self.prefixes[action]:
                    if p and norm.startswith(p):
                        return RuleMatch(action, f"{action}_prefixes:{raw}")
            for raw, rx in self.regex[action]:
                if rx.search(context):
                    return RuleMatch(action, f"{action}_regex:{raw}")
        return None


def compile_rule(pattern: str, key: str) -> re.Pattern[str]:
    """``re.compile(pattern)``; an invalid one is a ValueError naming ``key``."""
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(f"{key}: invalid regular expression {pattern!r}: {e}") from None
