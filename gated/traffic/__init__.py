"""Realistic agent-gateway traffic with a TRUE label, for scoring learning honestly.

The learning benchmark must score the daemon against what the policy really says, not
against the gate's noisy decisions, on a stream that looks like production: MCP-style
calls (``<tool> <JSON args>``) of 11 tools from ~8 interleaved agent sessions, each
passing its own history (its previous calls, at most 12); values drawn combinatorially,
so ~98% of contexts are distinct and memorising cannot work; 12 block categories, one of
which (``history_exfil``: an outbound POST/PUT or external mail within 10 calls of a
project-secret read) is decidable only from the history (sessions also read benign
config files, some of them before an allowed outbound call, so "a config file was read"
is not the rule: the history probes' allow twin is such a read); a gate that is wrong
`gate_error_rate` of the time, with most mistakes corrected 5-50 signals later; and a
policy change mid-stream (``v2``: HTTP/browsing only to allow-listed domains, no package
installs, force-push to main allowed), which flips ~21% of TRUE labels.

Labels come from `classify`, a pure function of (call, history, policy, workspace), so
the same call in the same situation never gets two TRUE labels, a stream can be
relabelled under the other policy, and the tests can check each rule on hand-written
calls. Every value pool has a TRAIN half (the stream) and a disjoint HELD-OUT half
(`GatewayTraffic.probes` only), so probes measure generalisation to values never seen.

Measured (seeds 0-5, 5,000 signals): TRUE block share 0.147-0.167, rule 12 0.025-0.04 of
traffic (outbound calls it concerns 0.05-0.06), mean history 3.6-4.1 entries, distinct
contexts 98.5%, v1 -> v2 flip share 0.20-0.22.

The package: `pools` (the values, each pool's two halves), `policy` (the TRUE label:
`classify`), `stream` (sessions, the noisy gate, the probes: `GatewayTraffic`).
"""

from .policy import (
    CATEGORY_REASON,
    TOOL_REASON,
    classify,
    destination_class,
    outbound,
    parse_call,
    true_allow,
    v2_domain,
)
from .pools import ORG_DOMAIN, POOLS, SECRET_WINDOW, V2_ALLOWLIST
from .stream import FOLLOW, KINDS, WEIGHTS, Event, GatewayTraffic, call

__all__ = ["CATEGORY_REASON", "FOLLOW", "KINDS", "ORG_DOMAIN", "POOLS", "SECRET_WINDOW",
           "TOOL_REASON", "V2_ALLOWLIST", "WEIGHTS", "Event", "GatewayTraffic", "call",
           "classify", "destination_class", "outbound", "parse_call", "true_allow",
           "v2_domain"]
